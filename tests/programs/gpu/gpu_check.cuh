// Shared helpers for the GPU test programs: driver entry points through cudart, an input mixer, the line format that
// tests/gpu/check_pool_run.py reads (ptr / result / case / info lines on stdout). Failing calls go through
// VMMCKPT_CHECK (support/cuda_check.hpp), as in every test and benchmark program.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

namespace gpu_check {

using vmmckpt::contracts::print_ptr;

// Driver entry points are resolved through cudart rather than linked, so the programs that use
// them need no libcuda link and go through the resolver door the shim must cover.
inline void* driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  // 12000: ask for the ABI that CUDA 12.0 headers describe (cuMemAlloc -> cuMemAlloc_v2 etc.).
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::fprintf(stderr, "error: cannot resolve driver entry point %s: %s (status %d)\n", name,
                 cudaGetErrorName(err), static_cast<int>(status));
    std::exit(1);
  }
  return fn;
}

// Formats a status as one token, "<name>(<number>)", for the exact native-vs-shim comparison.
template <typename Status>
inline void format_code(char* out, size_t len, Status s) {
  std::snprintf(out, len, "%s(%d)", vmmckpt::programs::error_name(s), static_cast<int>(s));
}

// The programs' one option, `--device N` (default 0); anything else is a usage error (exit 2).
inline int device_option(int argc, char** argv) {
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--device" && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--device N]\n", argv[0]);
      std::exit(2);
    }
  }
  return device;
}

// A good integer mixer for the programs' inputs: values depend on index and seed only, never on addresses.
__host__ __device__ inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

inline void print_result(const char* name, uint64_t value) {
  std::printf("result %s 0x%016" PRIx64 "\n", name, value);
}

}  // namespace gpu_check

// Kernel launches report configuration errors only through the last-error state.
#define GPU_CHECK_LAUNCH() VMMCKPT_CHECK(cudaGetLastError())
