# Finds the CUDA toolkit and the header-only libraries every part uses.
# Everything but the CUDA toolkit is used header-only, so nothing we build
# depends on a shared spdlog or fmt (the shim must not clash with a host
# program's own copies). VMMCKPT_DEPS_PREFIX points at an unpacked set of
# Debian packages (scripts/fetch-deps.sh) on machines without them installed.

if(NOT CUDAToolkit_ROOT AND DEFINED ENV{CUDA_HOME})
  set(CUDAToolkit_ROOT $ENV{CUDA_HOME})
endif()
find_package(CUDAToolkit REQUIRED)

set(VMMCKPT_DEPS_PREFIX "$ENV{VMMCKPT_DEPS_PREFIX}" CACHE PATH "Unpacked Debian packages (usr/include inside)")
set(_vmmckpt_hint_dirs)
if(VMMCKPT_DEPS_PREFIX)
  list(APPEND _vmmckpt_hint_dirs ${VMMCKPT_DEPS_PREFIX}/usr/include)
endif()

function(vmmckpt_find_header var header package)
  find_path(${var} ${header} HINTS ${_vmmckpt_hint_dirs})
  if(NOT ${var})
    message(FATAL_ERROR "${header} not found: install the Debian package ${package} (scripts/test.sh does this)")
  endif()
endfunction()

vmmckpt_find_header(VMMCKPT_SPDLOG_INCLUDE spdlog/spdlog.h libspdlog-dev)
vmmckpt_find_header(VMMCKPT_FMT_INCLUDE fmt/format.h libfmt-dev)
vmmckpt_find_header(VMMCKPT_CLI11_INCLUDE CLI/CLI.hpp libcli11-dev)
vmmckpt_find_header(VMMCKPT_JSON_INCLUDE nlohmann/json.hpp nlohmann-json3-dev)
vmmckpt_find_header(VMMCKPT_CATCH2_INCLUDE catch2/catch.hpp catch2)
vmmckpt_find_header(VMMCKPT_XXHASH_INCLUDE xxhash.h libxxhash-dev)

# Header-only spdlog over header-only fmt: compiled into whoever uses it.
add_library(vmmckpt_logging_headers INTERFACE)
target_include_directories(vmmckpt_logging_headers SYSTEM INTERFACE
  ${VMMCKPT_SPDLOG_INCLUDE} ${VMMCKPT_FMT_INCLUDE})
target_compile_definitions(vmmckpt_logging_headers INTERFACE
  SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)

add_library(vmmckpt_cli_headers INTERFACE)
target_include_directories(vmmckpt_cli_headers SYSTEM INTERFACE
  ${VMMCKPT_CLI11_INCLUDE} ${VMMCKPT_JSON_INCLUDE})

# XXH3 used header-only (XXH_INLINE_ALL): nothing links libxxhash.
add_library(vmmckpt_xxhash_headers INTERFACE)
target_include_directories(vmmckpt_xxhash_headers SYSTEM INTERFACE ${VMMCKPT_XXHASH_INCLUDE})

add_library(vmmckpt_catch2 INTERFACE)
target_include_directories(vmmckpt_catch2 SYSTEM INTERFACE ${VMMCKPT_CATCH2_INCLUDE})

# CUDA headers only: the shim and the emulator never link libcuda or libcudart.
add_library(vmmckpt_cuda_headers INTERFACE)
target_include_directories(vmmckpt_cuda_headers SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
