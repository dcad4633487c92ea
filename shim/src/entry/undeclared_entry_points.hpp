// The served names that cuda.h and cuda_runtime_api.h do not declare under these names: cuGetProcAddress's
// v1 ABI (cuda.h renames it to _v2) and the per-thread-stream (_ptsz) runtime functions. Both the table of
// served entry points and the resolvers name them.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#undef cuGetProcAddress  // cuda.h renames it to _v2; the v1 ABI is exported too
// cudaGetDriverEntryPoint is deprecated, and still called by programs: we serve it.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

extern "C" {
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags);
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** dev_ptr, size_t size, cudaStream_t stream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* dev_ptr, cudaStream_t stream);
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** func, unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* status);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** func, unsigned int version,
                                                            unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* status);
}
