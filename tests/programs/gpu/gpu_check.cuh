// Shared helpers for the GPU test programs: the one checking macro and the line format that
// tests/gpu/check_pool_run.py reads (ptr / result / case / info lines on stdout).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace gpu_check {

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

inline const char* result_name(cudaError_t err) { return cudaGetErrorName(err); }

inline const char* result_name(CUresult res) {
  using get_error_name_fn = CUresult (*)(CUresult, const char**);
  static auto fn = reinterpret_cast<get_error_name_fn>(driver_entry_point("cuGetErrorName"));
  const char* name = nullptr;
  if (fn(res, &name) != CUDA_SUCCESS || name == nullptr) return "CUDA_ERROR_<unknown>";
  return name;
}

template <typename Status>
inline void check(Status status, Status ok, const char* stmt, const char* file, int line) {
  if (status == ok) return;
  std::fprintf(stderr, "CUDA call failed: %s\n  at %s:%d: %s (%d)\n", stmt, file, line,
               result_name(status), static_cast<int>(status));
  std::fflush(stderr);
  std::exit(1);
}

inline void check_status(cudaError_t s, const char* stmt, const char* file, int line) {
  check(s, cudaSuccess, stmt, file, line);
}
inline void check_status(CUresult s, const char* stmt, const char* file, int line) {
  check(s, CUDA_SUCCESS, stmt, file, line);
}

// Formats a status as one token, "<name>(<number>)", for the exact native-vs-shim comparison.
inline void format_code(char* out, size_t len, cudaError_t s) {
  std::snprintf(out, len, "%s(%d)", cudaGetErrorName(s), static_cast<int>(s));
}
inline void format_code(char* out, size_t len, CUresult s) {
  std::snprintf(out, len, "%s(%d)", result_name(s), static_cast<int>(s));
}

inline void print_ptr(const void* p, size_t bytes, const char* api) {
  std::printf("ptr 0x%" PRIxPTR " %zu %s\n", reinterpret_cast<uintptr_t>(p), bytes, api);
}

inline void print_ptr(CUdeviceptr p, size_t bytes, const char* api) {
  std::printf("ptr 0x%llx %zu %s\n", static_cast<unsigned long long>(p), bytes, api);
}

inline void print_result(const char* name, uint64_t value) {
  std::printf("result %s 0x%016" PRIx64 "\n", name, value);
}

}  // namespace gpu_check

// Every CUDA (runtime or driver, and cuBLAS where the program adds an overload) call goes
// through this: on failure it names the statement, the place and the error, and exits 1.
#define GPU_CHECK(stmt) ::gpu_check::check_status((stmt), #stmt, __FILE__, __LINE__)

// Kernel launches report configuration errors only through the last-error state.
#define GPU_CHECK_LAUNCH() GPU_CHECK(cudaGetLastError())
