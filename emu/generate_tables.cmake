# Generates the emulator's tables from the installed CUDA headers, so they follow the toolkit:
#   known_symbols.inc: every driver entry point and ABI version (PFN_<name>_v<version> typedefs in
#                      cudaTypedefs.h), for the resolver's version mapping and unimplemented stubs;
#   error_names.inc:   every CUresult enumerator in cuda.h, for cuGetErrorName.
# Invoked at build time with -DCUDA_INCLUDE_DIR=... -DOUT_DIR=...

file(STRINGS "${CUDA_INCLUDE_DIR}/cudaTypedefs.h" typedef_lines REGEX "PFN_cu[A-Za-z0-9_]+_v[0-9]+\\)")
set(known "")
set(seen "")
foreach(line IN LISTS typedef_lines)
  if(line MATCHES "PFN_(cu[A-Za-z0-9_]+)_v([0-9]+)\\)")
    set(entry "VMMCKPT_KNOWN(${CMAKE_MATCH_1}, ${CMAKE_MATCH_2})")
    list(FIND seen "${entry}" found)
    if(found EQUAL -1)
      list(APPEND seen "${entry}")
      string(APPEND known "${entry}\n")
    endif()
  endif()
endforeach()
file(WRITE "${OUT_DIR}/known_symbols.inc.tmp" "${known}")
file(COPY_FILE "${OUT_DIR}/known_symbols.inc.tmp" "${OUT_DIR}/known_symbols.inc" ONLY_IF_DIFFERENT)

file(STRINGS "${CUDA_INCLUDE_DIR}/cuda.h" error_lines REGEX "^[ \t]*CUDA_(SUCCESS|ERROR_[A-Z0-9_]+)[ \t]*=[ \t]*[0-9]+")
set(errors "")
foreach(line IN LISTS error_lines)
  if(line MATCHES "^[ \t]*(CUDA_[A-Z0-9_]+)[ \t]*=")
    string(APPEND errors "VMMCKPT_ERROR(${CMAKE_MATCH_1})\n")
  endif()
endforeach()
file(WRITE "${OUT_DIR}/error_names.inc.tmp" "${errors}")
file(COPY_FILE "${OUT_DIR}/error_names.inc.tmp" "${OUT_DIR}/error_names.inc" ONLY_IF_DIFFERENT)
