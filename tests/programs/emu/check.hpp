// Tiny helpers for the emulator test programs: checked CUDA calls and the `ptr` output lines.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CU(call)                                                                                    \
  do {                                                                                                    \
    const CUresult check_result_ = (call);                                                                \
    if (check_result_ != CUDA_SUCCESS) {                                                                  \
      const char* check_name_ = nullptr;                                                                  \
      cuGetErrorName(check_result_, &check_name_);                                                        \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                           \
                   check_name_ ? check_name_ : "?");                                                      \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

#define CHECK_RT(call)                                                                                    \
  do {                                                                                                    \
    const cudaError_t check_error_ = (call);                                                              \
    if (check_error_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                           \
                   cudaGetErrorName(check_error_));                                                       \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

#define EXPECT(cond)                                                                                      \
  do {                                                                                                    \
    if (!(cond)) {                                                                                        \
      std::fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond);                 \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

inline void print_ptr(unsigned long long addr, unsigned long long size, const char* api) {
  std::printf("ptr 0x%llx %llu %s\n", addr, size, api);
}
