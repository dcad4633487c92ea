// How a test or benchmark program fails a CUDA call: VMMCKPT_CHECK names the call, the place and the error, and exits 1.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>  // declarations only: a program that never checks a runtime call needs no cudart

#include <cstdio>
#include <cstdlib>

namespace vmmckpt::programs {

inline const char* error_name(cudaError_t e) { return cudaGetErrorName(e); }

// Programs nvcc builds reach the driver through cudart's entry point: they need not link libcuda, and
// it is the resolver door the shim must cover. The others link libcuda and call it.
inline const char* error_name(CUresult r) {
  const char* name = nullptr;
#ifdef __CUDACC__
  using get_error_name_fn = CUresult (*)(CUresult, const char**);
  static const auto get_error_name = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    // 12000: the ABI the CUDA 12.0 headers describe (cuMemAlloc -> cuMemAlloc_v2 etc.).
    if (cudaGetDriverEntryPointByVersion("cuGetErrorName", &fn, 12000, cudaEnableDefault, &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<get_error_name_fn>(fn);
  }();
  if (get_error_name == nullptr || get_error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
#else
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
#endif
  return name ? name : "?";
}

[[noreturn]] inline void call_failed(const char* call, const char* file, int line, const char* error, int code) {
  std::fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", file, line, call, error, code);
  std::fflush(stderr);
  std::exit(1);
}

// Success is 0 for every status type (CUDA_SUCCESS, cudaSuccess, CUBLAS_STATUS_SUCCESS). A program adds
// a status type by declaring error_name(that type) in the type's namespace (the global one for CUDA's
// libraries), where argument-dependent lookup finds it.
template <class Status>
inline void check(Status status, const char* call, const char* file, int line) {
  if (status == Status{}) return;
  call_failed(call, file, line, error_name(status), static_cast<int>(status));
}

}  // namespace vmmckpt::programs

// Every CUDA call whose failure would make the rest meaningless goes through this.
#define VMMCKPT_CHECK(call) ::vmmckpt::programs::check((call), #call, __FILE__, __LINE__)

// A condition the program relies on; on failure it names the condition and the place, and exits 1.
#define VMMCKPT_EXPECT(cond)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
