// The table of real CUDA driver entry points that code running inside the program calls (NCCL-style, filled once at run time).
//
// The shim links no libcuda: shim/src/real_symbols.cpp fills this table from the libcuda.so.1 it
// loads, bypassing its own interposed names, and hands it to the restore engine too.
#pragma once

#include <cuda.h>

// ABIs that cuda.h hides behind macros or only declares for its own build.
extern "C" {
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
}

#define VMMCKPT_DRIVER_FUNCTIONS(X)                                                                   \
  X(cuInit) X(cuGetProcAddress_v2) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxSynchronize) \
  X(cuMemGetInfo_v2) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemGetAddressRange_v2) \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) \
  X(cuMemSetAccess) X(cuMemGetAllocationGranularity) X(cuMemExportToShareableHandle) X(cuDeviceGetName)  \
  X(cuMemGetAccess) X(cuMemGetAllocationPropertiesFromHandle) X(cuMemImportFromShareableHandle)     \
  X(cuDeviceGetAttribute) X(cuMemcpyHtoD_v2) X(cuMemHostAlloc) X(cuMemFreeHost)                      \
  X(cuMemHostRegister_v2) X(cuMemHostUnregister) X(cuCtxSetCurrent) X(cuStreamCreate)                 \
  X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuMemcpyHtoDAsync_v2) X(cuEventCreate)               \
  X(cuEventRecord) X(cuEventSynchronize) X(cuEventDestroy_v2) X(cuMemcpyDtoH_v2) X(cuMemsetD8_v2)
// Present only in newer drivers, or not on every platform: may stay null.
#define VMMCKPT_OPTIONAL_DRIVER_FUNCTIONS(X)                                                        \
  X(cuCtxSynchronize_v2) X(cuStreamGetDevice) X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz)            \
  X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemAllocManaged) X(cuMemPoolCreate)                  \
  X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuArrayCreate_v2) X(cuArray3DCreate_v2) \
  X(cuMipmappedArrayCreate) X(cuDeviceGetUuid_v2) X(cuPointerGetAttribute) X(cuPointerGetAttributes) \
  X(cuMemRetainAllocationHandle) X(cuArrayDestroy) X(cuMipmappedArrayDestroy)

namespace vmmckpt {

using get_proc_address_v1_fn = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t);

struct driver_api {
#define VMMCKPT_DECLARE(name) decltype(&::name) name = nullptr;
  VMMCKPT_DRIVER_FUNCTIONS(VMMCKPT_DECLARE)
  VMMCKPT_OPTIONAL_DRIVER_FUNCTIONS(VMMCKPT_DECLARE)
#undef VMMCKPT_DECLARE
  get_proc_address_v1_fn cuGetProcAddress_v1 = nullptr;  // cuda.h macro-renames the plain name
};

}  // namespace vmmckpt
