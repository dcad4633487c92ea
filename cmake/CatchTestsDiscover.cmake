# Run after a Catch2 test executable is built (cmake -P, from vmmckpt_catch_tests): lists its test cases and writes a ctest file with one test each.
include(${CONFIG})

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env ${environment} ${executable} ${spec} --list-test-names-only
  OUTPUT_VARIABLE output
  ERROR_VARIABLE errors
  RESULT_VARIABLE result)
# Catch2 exits with the number of test cases listed, so the exit code says nothing; no name at all
# means the executable could not run (or lists nothing), which must not pass as "no tests".
string(STRIP "${output}" output)
if(output STREQUAL "")
  message(FATAL_ERROR "${executable} ${spec} --list-test-names-only listed no test case (exit ${result}):\n${errors}")
endif()

# One name a line. Names may hold ';', so the lines are walked by position, never as a CMake list.
string(APPEND output "\n")
set(script "")
set(count 0)
while(NOT output STREQUAL "")
  string(FIND "${output}" "\n" end)
  string(SUBSTRING "${output}" 0 ${end} name)
  math(EXPR next "${end} + 1")
  string(SUBSTRING "${output}" ${next} -1 output)
  string(STRIP "${name}" name)
  if(name STREQUAL "")
    continue()
  endif()
  if(name MATCHES "\\]==\\]")
    message(FATAL_ERROR "test case name '${name}' holds ]==], which this script cannot quote")
  endif()
  # On Catch2's command line a test case name is a pattern: escape what its parser treats specially.
  string(REGEX REPLACE "([][\\\\,\"~*])" "\\\\\\1" pattern "${name}")
  string(APPEND script
    "add_test([==[${prefix}${name}]==] [==[${executable}]==] [==[${pattern}]==] -w NoTests)\n"
    "set_tests_properties([==[${prefix}${name}]==] PROPERTIES ${properties})\n")
  math(EXPR count "${count} + 1")
endwhile()
file(WRITE "${tests_file}" "${script}")
