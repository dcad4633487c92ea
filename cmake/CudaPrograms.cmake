# CUDA sources in the calling directory (GPU tests, GPU benchmarks): nvcc from the toolkit found by
# Dependencies.cmake, Hopper by default. A macro, so that it sets up the caller's directory.
#
# The project-wide -Wall -Wextra are host-compiler flags that nvcc rejects: they are passed through. -Werror
# (VMMCKPT_WERROR) stays on the C and C++ sources: nvcc's generated host code is not ours to keep warning-free.
# C++20 is given as a flag because CMake 3.25 does not know nvcc's CUDA20 dialect; for the same reason
# the project's CMAKE_CXX_STANDARD (which CUDA targets inherit) is dropped in that directory.
macro(vmmckpt_enable_cuda_programs)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  enable_language(CUDA)
  unset(CMAKE_CXX_STANDARD)
  unset(CMAKE_CXX_STANDARD_REQUIRED)
  unset(CMAKE_CXX_EXTENSIONS)
  unset(CMAKE_CUDA_STANDARD)
  set_property(DIRECTORY PROPERTY COMPILE_OPTIONS
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wall>
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wextra>
    $<$<AND:$<BOOL:${VMMCKPT_WERROR}>,$<COMPILE_LANGUAGE:C,CXX>>:-Werror>)
endmacro()
