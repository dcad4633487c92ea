# vmmckpt_catch_tests(): one ctest test per Catch2 test case of an executable, discovered after each build.
#
#   vmmckpt_catch_tests(TARGET PREFIX prefix [SPEC catch-test-spec...] [ENVIRONMENT VAR=value...]
#                       [PROPERTIES name value...])
#
# Each test case TEST of TARGET (those SPEC selects; by default every test case that is not hidden)
# becomes the ctest test "<prefix>TEST", which runs TARGET on that one test case with `-w NoTests` (a
# name that matches nothing fails instead of passing empty) and SKIP_RETURN_CODE 77
# (tests/support/catch_main.cpp). ENVIRONMENT applies to the tests and to the discovery run (an
# executable that needs the emulated driver to load needs it to list its tests too).
#
# Why not Catch2's own catch_discover_tests: its test list is a CMake list, which splits the names that
# hold a ';' (ours do); it runs the executable without any environment; and it passes properties on a
# command line, which flattens an ENVIRONMENT of two variables.
set(_vmmckpt_catch_discover_script ${CMAKE_CURRENT_LIST_DIR}/CatchTestsDiscover.cmake)

function(vmmckpt_catch_tests target)
  cmake_parse_arguments(arg "" "PREFIX" "SPEC;ENVIRONMENT;PROPERTIES" ${ARGN})
  if(NOT arg_PREFIX)
    message(FATAL_ERROR "vmmckpt_catch_tests(${target}): PREFIX is required (the test names say their area)")
  endif()
  string(SHA1 key "${arg_PREFIX};${arg_SPEC}")
  string(SUBSTRING ${key} 0 8 key)
  set(base ${CMAKE_CURRENT_BINARY_DIR}/${target}-${key})

  # set_tests_properties arguments, every value a bracket argument so that it stays one value.
  set(properties "SKIP_RETURN_CODE 77 WORKING_DIRECTORY [==[${CMAKE_CURRENT_BINARY_DIR}]==]")
  if(arg_ENVIRONMENT)
    string(APPEND properties " ENVIRONMENT [==[${arg_ENVIRONMENT}]==]")
  endif()
  list(LENGTH arg_PROPERTIES n)
  math(EXPR odd "${n} % 2")
  if(odd)
    message(FATAL_ERROR "vmmckpt_catch_tests(${target}): PROPERTIES takes name value pairs")
  endif()
  while(arg_PROPERTIES)
    list(POP_FRONT arg_PROPERTIES name value)
    string(APPEND properties " ${name} [==[${value}]==]")
  endwhile()

  # What the discovery script needs, in a file: lists survive there, not on a command line. Level-3
  # brackets, since `properties` holds level-2 ones.
  file(GENERATE OUTPUT ${base}-discovery.cmake CONTENT
"set(executable [===[$<TARGET_FILE:${target}>]===])
set(prefix [===[${arg_PREFIX}]===])
set(spec [===[${arg_SPEC}]===])
set(environment [===[${arg_ENVIRONMENT}]===])
set(properties [===[${properties}]===])
set(tests_file [===[${base}-tests.cmake]===])
")
  add_custom_command(TARGET ${target} POST_BUILD
    BYPRODUCTS ${base}-tests.cmake
    COMMAND ${CMAKE_COMMAND} -D CONFIG=${base}-discovery.cmake -P ${_vmmckpt_catch_discover_script}
    COMMENT "Listing the test cases of ${target} (${arg_PREFIX}*)"
    VERBATIM)

  # Read by ctest: the discovered tests, or one failing test saying that the executable was not built.
  file(WRITE ${base}-include.cmake
"if(EXISTS [==[${base}-tests.cmake]==])
  include([==[${base}-tests.cmake]==])
else()
  add_test([==[${arg_PREFIX}NOT_BUILT]==] [==[${CMAKE_COMMAND}]==] -E echo
           [==[${target} is not built: build it to list its tests]==])
  set_tests_properties([==[${arg_PREFIX}NOT_BUILT]==] PROPERTIES WILL_FAIL TRUE ${properties})
endif()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${base}-include.cmake)
endfunction()
