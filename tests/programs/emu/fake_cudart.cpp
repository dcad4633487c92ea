// A stand-in libcudart for the served-doors test: just the entry-point queries, answered from the real driver.
//
// NVIDIA's cudart refuses to run on the emulated driver, so the shim's cudaGetDriverEntryPoint*
// wrappers are exercised here against this stand-in, which answers as cudart does: with the
// driver's own cuGetProcAddress. Loaded with RTLD_DEEPBIND, its call binds to the libcuda it links,
// not to the preloaded shim's cuGetProcAddress, so what the shim's wrappers get back is the
// driver's pointer, as with the real cudart.
#include <cuda.h>
#include <cuda_runtime_api.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {

cudaError_t query(const char* symbol, void** func, int version, unsigned long long flags,
                  cudaDriverEntryPointQueryResult* status) {
  if (func == nullptr) return cudaErrorInvalidValue;
  CUdriverProcAddressQueryResult s = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = cuGetProcAddress_v2(symbol, func, version, flags, &s);
  if (status != nullptr)
    *status = s == CU_GET_PROC_ADDRESS_SUCCESS                  ? cudaDriverEntryPointSuccess
              : s == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? cudaDriverEntryPointVersionNotSufficent
                                                                : cudaDriverEntryPointSymbolNotFound;
  return r == CUDA_SUCCESS && s == CU_GET_PROC_ADDRESS_SUCCESS ? cudaSuccess : cudaErrorSymbolNotFound;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}

__attribute__((visibility("default"))) cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** func,
                                                                           unsigned long long flags,
                                                                           cudaDriverEntryPointQueryResult* status) {
  return query(symbol, func, 13000, flags, status);
}

__attribute__((visibility("default"))) cudaError_t cudaGetDriverEntryPoint_ptsz(
    const char* symbol, void** func, unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return query(symbol, func, 13000, flags == cudaEnableDefault ? 0ULL + cudaEnablePerThreadDefaultStream : flags,
               status);
}

__attribute__((visibility("default"))) cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** func, unsigned int version, unsigned long long flags,
    cudaDriverEntryPointQueryResult* status) {
  return query(symbol, func, static_cast<int>(version), flags, status);
}

__attribute__((visibility("default"))) cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char* symbol, void** func, unsigned int version, unsigned long long flags,
    cudaDriverEntryPointQueryResult* status) {
  return query(symbol, func, static_cast<int>(version),
               flags == cudaEnableDefault ? 0ULL + cudaEnablePerThreadDefaultStream : flags, status);
}

}  // extern "C"
