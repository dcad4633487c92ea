# Writes the man page cuda-ckpt.1 from `cuda-ckpt --help` and each subcommand's --help, so the page
# never drifts from the tool. Run with cmake -P: -DCUDA_CKPT=path -DOUTPUT=path -DVERSION=x.y.z
# (the tool needs no CUDA driver for its help).

function(help_of out)
  execute_process(COMMAND ${CUDA_CKPT} ${ARGN} --help OUTPUT_VARIABLE text ERROR_VARIABLE error RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cuda-ckpt ${ARGN} --help failed (${rc}): ${error}")
  endif()
  # CLI11 prints argv[0], here the build tree's path.
  string(REPLACE "${CUDA_CKPT}" "cuda-ckpt" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# Help text as verbatim roff: backslashes escaped, and a line starting with . or ' must not read as a request.
function(as_roff out text)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${out} ".nf\n${text}\n.fi\n" PARENT_SCOPE)
endfunction()

help_of(main_help)
# The subcommands are the indented first words under CLI11's "SUBCOMMANDS:" heading, up to the blank line.
string(REGEX MATCH "[Ss][Uu][Bb][Cc][Oo][Mm][Mm][Aa][Nn][Dd][Ss]:\n(.*)" after "${main_help}")
string(REGEX REPLACE "\n\n.*" "" listing "${CMAKE_MATCH_1}")
string(REGEX MATCHALL "(^|\n)  [a-z][a-z-]*" subcommands "${listing}")
list(TRANSFORM subcommands STRIP)
if(NOT subcommands)
  message(FATAL_ERROR "no subcommands found in `cuda-ckpt --help`:\n${main_help}")
endif()

as_roff(description "${main_help}")
string(CONCAT page ".TH CUDA-CKPT 1 \"\" \"vmmckpt ${VERSION}\" \"User Commands\"\n"
         ".SH NAME\ncuda-ckpt \\- deterministic-address checkpoint/restart for CUDA programs\n"
         ".SH SYNOPSIS\n.B cuda-ckpt\n.I SUBCOMMAND\n[\n.I OPTIONS\n]\n"
         ".SH DESCRIPTION\n${description}.SH SUBCOMMANDS\n")
foreach(sub IN LISTS subcommands)
  help_of(sub_help ${sub})
  as_roff(body "${sub_help}")
  string(APPEND page ".SS ${sub}\n${body}")
endforeach()
string(APPEND page ".SH FILES\n.TP\n.I libvmmckpt.so\nthe shim that cuda-ckpt run preloads, found through VMMCKPT_SHIM or next to cuda-ckpt\n"
                   ".SH SEE ALSO\nshare/doc/vmmckpt/README.md under the install prefix\n")
file(WRITE ${OUTPUT} "${page}")
