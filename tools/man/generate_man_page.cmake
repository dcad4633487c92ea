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

# Lines of more than 80 columns folded at spaces: a continuation starts where the line's text does after its
# first run of two or more spaces (an option's description), else at the line's own indentation.
function(fold_lines out text)
  set(width 80)
  string(REPLACE ";" "\\;" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(folded "")
  foreach(line IN LISTS lines)
    string(LENGTH "${line}" length)
    while(length GREATER width)
      if(line MATCHES "^( *[^ ].*[^ ]  +)[^ ]")
        string(LENGTH "${CMAKE_MATCH_1}" indent)
      elseif(line MATCHES "^( +)")
        string(LENGTH "${CMAKE_MATCH_1}" indent)
      else()
        set(indent 0)
      endif()
      if(indent GREATER 40)
        set(indent 8)  # a description that starts far right: its continuations start near the left
      endif()
      # The last space at or before the width, past the indentation.
      string(SUBSTRING "${line}" 0 ${width} head)
      string(FIND "${head}" " " cut REVERSE)
      if(cut LESS_EQUAL indent)
        break()  # one word longer than the room: left as it is
      endif()
      string(SUBSTRING "${line}" 0 ${cut} first)
      math(EXPR rest_at "${cut} + 1")
      string(SUBSTRING "${line}" ${rest_at} -1 rest)
      string(REPEAT " " ${indent} pad)
      string(APPEND folded "${first}\n")
      set(line "${pad}${rest}")
      string(LENGTH "${line}" length)
    endwhile()
    string(APPEND folded "${line}\n")
  endforeach()
  set(${out} "${folded}" PARENT_SCOPE)
endfunction()

# Help text as verbatim roff: backslashes escaped, and a line starting with . or ' must not read as a request.
function(as_roff out text)
  fold_lines(text "${text}")
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
string(APPEND page ".SH FILES\n.TP\n.I libvmmckpt.so\nthe shim that cuda-ckpt run preloads, found through VMMCKPT_SHIM or next\nto cuda-ckpt\n"
                   ".SH SEE ALSO\nshare/doc/vmmckpt/README.md under the install prefix\n")
file(WRITE ${OUTPUT} "${page}")
