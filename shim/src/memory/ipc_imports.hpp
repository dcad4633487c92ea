// Legacy CUDA IPC, the importing side: opening a handle another process under the shim gave out (docs/ipc.md).
#pragma once

#include <cuda.h>

#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/protocol/ipc_handle.hpp"

namespace vmmckpt::detail {

// cuIpcOpenMemHandle: false when the bytes are not a handle of ours (the driver answers for them). Otherwise
// `result` is what the driver would answer, and on success *out points at the allocation's base, mapped in
// this process's import window. A handle opened again returns the same pointer and counts one more reference.
bool open_import(const unsigned char (&bytes)[ipc_handle_size], unsigned int flags, CUdeviceptr* out, CUresult& result);
// cuIpcCloseMemHandle: false when ptr is no import of ours. The last reference unmaps.
bool close_import(CUdeviceptr ptr, CUresult& result);

// What this process maps of other processes' memory now, for dumps: they record it and copy none of it.
std::vector<ipc_import> current_imports();

}  // namespace vmmckpt::detail
