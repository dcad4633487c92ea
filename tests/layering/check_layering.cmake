# The layering of common/ (common/CMakeLists.txt) and the shim's floors, checked in the sources: what the build cannot tell.
# The include directories already make an include of a library a target does not link fail to compile; this
# also fails when
#   * a library of common/ includes one of its own layer or above it (protocol and image are one layer),
#   * anything outside common/<library>/ includes that library's detail/ headers,
#   * anything includes a header at its path before the split (vmmckpt/<name>.hpp; only vmmckpt/vmmckpt.h,
#     the installed API, and the parts' own vmmckpt/<part>/ folders are at the top),
#   * a file of the shim includes one of a floor above its own (shim/CMakeLists.txt: entry/ over
#     operations/ over memory/ over core/), or one of shim/src at no floor,
#   * ckpt/ includes restore/tool's headers (the restores are built on ckpt, not under it), or the restore
#     engine (restore/src, linked into the shim) includes the tool's side, ckpt's or restore/tool's.
# Usage: cmake -DROOT=<source dir> -P check_layering.cmake
cmake_minimum_required(VERSION 3.25)
set(layer_support 0)
set(layer_pool 1)
set(layer_protocol 2)
set(layer_image 2)
set(libraries support pool protocol image)
set(floor_core 0)
set(floor_memory 1)
set(floor_operations 2)
set(floor_entry 3)
set(floors core memory operations entry)

file(GLOB_RECURSE sources RELATIVE ${ROOT} LIST_DIRECTORIES false
  ${ROOT}/common/*.[ch]pp ${ROOT}/common/*.cu ${ROOT}/common/*.h ${ROOT}/common/*.in
  ${ROOT}/shim/*.[ch]pp ${ROOT}/shim/*.h ${ROOT}/shim/*.inc ${ROOT}/ckpt/*.[ch]pp ${ROOT}/ckpt/*.cu
  ${ROOT}/restore/*.[ch]pp ${ROOT}/tools/*.[ch]pp ${ROOT}/criu/*.[ch]pp ${ROOT}/emu/*.[ch]pp ${ROOT}/demo/*.[ch]pp
  ${ROOT}/demo/*.cu ${ROOT}/bench/*.[ch]pp ${ROOT}/bench/*.cu ${ROOT}/tests/*.[ch]pp ${ROOT}/tests/*.cu
  ${ROOT}/python/*.[ch]pp)
set(problems "")
foreach(file IN LISTS sources)
  set(own "")
  if(file MATCHES "^common/([a-z_]+)/")
    set(own ${CMAKE_MATCH_1})
  endif()
  file(STRINGS ${ROOT}/${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]vmmckpt/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" path "${line}")
    if(path MATCHES "^vmmckpt/[^/]+$" AND NOT path STREQUAL "vmmckpt/vmmckpt.h")
      string(APPEND problems "\n  ${file}: ${path} is a path from before the split of common/: now vmmckpt/<library>/<name> (README.md, \"Layout\")")
    endif()
    if(file MATCHES "^ckpt/" AND path MATCHES "^vmmckpt/restore/tool/")
      string(APPEND problems "\n  ${file}: ckpt includes ${path}: restore/tool is built on ckpt")
    endif()
    if(file MATCHES "^restore/(src|include)/" AND path MATCHES "^vmmckpt/(ckpt|restore/tool)/")
      string(APPEND problems "\n  ${file}: the restore engine (linked into the shim) includes ${path} of the tool's side")
    endif()
    if(NOT path MATCHES "^vmmckpt/([a-z_]+)/")
      continue()
    endif()
    set(lib ${CMAKE_MATCH_1})
    if(NOT lib IN_LIST libraries)
      continue()
    endif()
    if(path MATCHES "^vmmckpt/${lib}/detail/" AND NOT own STREQUAL lib)
      string(APPEND problems "\n  ${file}: ${path} is ${lib}'s detail, for common/${lib}/ alone")
    endif()
    if(own AND NOT own STREQUAL lib AND NOT layer_${lib} LESS layer_${own})
      string(APPEND problems "\n  ${file}: ${own} (layer ${layer_${own}}) includes ${path} of ${lib} (layer ${layer_${lib}})")
    endif()
  endforeach()
endforeach()

# The shim's floors: its own includes are "<floor>/<name>", relative to shim/src.
foreach(file IN LISTS sources)
  if(NOT file MATCHES "^shim/src/([a-z_]+)/")
    continue()
  endif()
  set(own ${CMAKE_MATCH_1})
  if(NOT own IN_LIST floors)
    string(APPEND problems "\n  ${file}: shim/src/${own}/ is no floor of the shim (${floors})")
    continue()
  endif()
  file(STRINGS ${ROOT}/${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" path "${line}")
    if(path MATCHES "^vmmckpt/")
      continue()
    endif()
    if(NOT path MATCHES "^([a-z_]+)/[^/]+$" OR NOT CMAKE_MATCH_1 IN_LIST floors)
      string(APPEND problems "\n  ${file}: \"${path}\" names no floor of the shim (\"<floor>/<name>\")")
      continue()
    endif()
    set(floor ${CMAKE_MATCH_1})
    if(floor_${floor} GREATER floor_${own})
      string(APPEND problems "\n  ${file}: ${own} (floor ${floor_${own}}) includes ${path}, a floor above it")
    endif()
  endforeach()
endforeach()

list(LENGTH sources count)
if(problems)
  message(FATAL_ERROR "the layering is broken:${problems}")
endif()
message(STATUS "${count} files: every include keeps to the layers of common/ and the floors of the shim")
