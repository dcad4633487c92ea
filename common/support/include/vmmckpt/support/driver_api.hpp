// The table of real CUDA driver entry points (NCCL-style, filled once at run time), for the shim and for cuda-ckpt.
//
// Neither links libcuda. The shim (shim/src/core/real_symbols.cpp) fills this table from the libcuda.so.1
// it loads, bypassing its own interposed names, and hands it to the restore engine too; cuda-ckpt
// (ckpt/src/base/driver.cpp) fills it only for the commands that touch a GPU, so that the others run on
// machines without a driver. Both fill it through fill_driver_api below.
#pragma once

#include <cuda.h>

// ABIs that cuda.h hides behind macros or only declares for its own build.
extern "C" {
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
}

// The lists as written: clang-format would stair-step their continuation lines.
// clang-format off
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
  X(cuEventRecord) X(cuEventSynchronize) X(cuEventDestroy_v2) X(cuMemcpyDtoH_v2) X(cuMemsetD8_v2)        \
  X(cuMemsetD8Async)
// Present only in newer drivers, or not on every platform: may stay null.
#define VMMCKPT_OPTIONAL_DRIVER_FUNCTIONS(X)                                                        \
  X(cuCtxSynchronize_v2) X(cuStreamGetDevice) X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz)            \
  X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemAllocManaged) X(cuMemPoolCreate)                  \
  X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuArrayCreate_v2) X(cuArray3DCreate_v2) \
  X(cuMipmappedArrayCreate) X(cuDeviceGetUuid_v2) X(cuPointerGetAttribute) X(cuPointerGetAttributes) \
  X(cuMemRetainAllocationHandle) X(cuArrayDestroy) X(cuMipmappedArrayDestroy)                       \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel)                   \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)                             \
  X(cuCtxEnablePeerAccess) X(cuDeviceCanAccessPeer) X(cuCtxGetDevice_v2) X(cuMemPoolDestroy)           \
  X(cuMemPoolGetAttribute) X(cuMemPoolSetAccess)
// Called by cuda-ckpt only (besides the first list): required by the tool, optional in the shim.
#define VMMCKPT_TOOL_DRIVER_FUNCTIONS(X)                                                            \
  X(cuDeviceGetCount) X(cuGetErrorName) X(cuGetErrorString) X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoDAsync_v2) \
  X(cuStreamWaitEvent)

// The driver's process checkpoint API (driver 550 and later), used by cuda-ckpt's whole-process mode
// only: optional, a driver without it refuses that mode alone.
#define VMMCKPT_PROCESS_CHECKPOINT_FUNCTIONS(X)                                                        \
  X(cuCheckpointProcessGetState) X(cuCheckpointProcessLock) X(cuCheckpointProcessCheckpoint)          \
  X(cuCheckpointProcessRestore) X(cuCheckpointProcessUnlock)
// clang-format on

namespace vmmckpt {

using get_proc_address_v1_fn = CUresult(CUDAAPI*)(const char*, void**, int, cuuint64_t);

struct driver_api {
// NOLINTNEXTLINE(bugprone-macro-parentheses): `name` is a declarator here, which parentheses would not fit.
#define VMMCKPT_DECLARE(name) decltype(&::name) name = nullptr;
  VMMCKPT_DRIVER_FUNCTIONS(VMMCKPT_DECLARE)
  VMMCKPT_OPTIONAL_DRIVER_FUNCTIONS(VMMCKPT_DECLARE)
  VMMCKPT_TOOL_DRIVER_FUNCTIONS(VMMCKPT_DECLARE)
  VMMCKPT_PROCESS_CHECKPOINT_FUNCTIONS(VMMCKPT_DECLARE)
#undef VMMCKPT_DECLARE
  get_proc_address_v1_fn cuGetProcAddress_v1 = nullptr;  // cuda.h macro-renames the plain name
};

// Who fills the table: which lists it cannot do without.
enum class driver_user { program, tool };

// Fills `api` with lookup(name) for every name of the lists (lookup: dlsym on the loaded libcuda,
// or the shim's own dlsym), and calls missing(name) for each one `user` requires that is absent.
template <class Lookup, class Missing>
void fill_driver_api(driver_api& api, driver_user user, Lookup&& lookup, Missing&& missing) {
  const bool tool = user == driver_user::tool;
#define VMMCKPT_FILL(name, required)                              \
  api.name = reinterpret_cast<decltype(api.name)>(lookup(#name)); \
  if (api.name == nullptr && (required)) missing(#name);
#define VMMCKPT_FILL_REQUIRED(name) VMMCKPT_FILL(name, true)
#define VMMCKPT_FILL_OPTIONAL(name) VMMCKPT_FILL(name, false)
#define VMMCKPT_FILL_TOOL(name) VMMCKPT_FILL(name, tool)
  VMMCKPT_DRIVER_FUNCTIONS(VMMCKPT_FILL_REQUIRED)
  VMMCKPT_OPTIONAL_DRIVER_FUNCTIONS(VMMCKPT_FILL_OPTIONAL)
  VMMCKPT_TOOL_DRIVER_FUNCTIONS(VMMCKPT_FILL_TOOL)
  if (tool) {
    VMMCKPT_PROCESS_CHECKPOINT_FUNCTIONS(VMMCKPT_FILL_OPTIONAL)
  }
#undef VMMCKPT_FILL_TOOL
#undef VMMCKPT_FILL_OPTIONAL
#undef VMMCKPT_FILL_REQUIRED
#undef VMMCKPT_FILL
  api.cuGetProcAddress_v1 = reinterpret_cast<get_proc_address_v1_fn>(lookup("cuGetProcAddress"));
}

}  // namespace vmmckpt
