// The legacy CUDA IPC doors: cuIpcGetMemHandle, cuIpcOpenMemHandle and cuIpcCloseMemHandle (the runtime's
// cudaIpc* reach them through the resolvers). Pool memory is VMM memory, which the driver's legacy handles
// cannot name, so the shim gives out handles of its own for it; everything else passes through.
#include <cuda.h>

#include "entry/entry_points.hpp"
#include "memory/ipc_exports.hpp"
#include "memory/ipc_imports.hpp"

static_assert(sizeof(CUipcMemHandle) == vmmckpt::ipc_handle_size);

using namespace vmmckpt;
using namespace vmmckpt::detail;

namespace {

unsigned char (&bytes_of(CUipcMemHandle& h))[ipc_handle_size] {
  return *reinterpret_cast<unsigned char(*)[ipc_handle_size]>(h.reserved);
}

}  // namespace

VMMCKPT_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    CUresult result;
    if (shim_active() && pHandle != nullptr && export_pool_memory(dptr, bytes_of(*pHandle), result)) return result;
    return d.cuIpcGetMemHandle != nullptr ? d.cuIpcGetMemHandle(pHandle, dptr) : CUDA_ERROR_NOT_SUPPORTED;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    CUresult result;
    if (shim_active() && open_import(bytes_of(handle), Flags, pdptr, result)) return result;
    return d.cuIpcOpenMemHandle_v2 != nullptr ? d.cuIpcOpenMemHandle_v2(pdptr, handle, Flags)
                                              : CUDA_ERROR_NOT_SUPPORTED;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    CUresult result;
    if (shim_active() && close_import(dptr, result)) return result;
    return d.cuIpcCloseMemHandle != nullptr ? d.cuIpcCloseMemHandle(dptr) : CUDA_ERROR_NOT_SUPPORTED;
  });
}
