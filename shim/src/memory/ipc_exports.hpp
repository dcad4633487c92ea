// Legacy CUDA IPC, the exporting side: handles for pool memory, and the importers that open them (docs/ipc.md).
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <atomic>
#include <optional>
#include <variant>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/protocol/ipc_handle.hpp"

namespace vmmckpt::detail {

// cuIpcGetMemHandle: false when addr lies in no pool (the driver answers for it). Otherwise `result` is
// CUDA_SUCCESS with the handle of the live allocation holding addr in `out` (the same bytes for any address in
// it, until it is freed), or CUDA_ERROR_INVALID_VALUE when no live allocation holds addr.
bool export_pool_memory(CUdeviceptr addr, unsigned char (&out)[ipc_handle_size], CUresult& result);

// Set at the first export: until then a pool free skips free_exported (one relaxed load on the hot path).
inline std::atomic<bool> any_pool_memory_exported{false};

// From a pool free, before the block goes back, once anything was exported: nothing when the allocation at
// base has no importer mapping it (its handles are stale from now on, and the pool frees it); otherwise the
// free's answer, and the block stays out of the pool until the last importer closes it or ends, as the
// driver keeps such memory alive.
std::optional<CUresult> free_exported(std::uint64_t base) noexcept;

// ipc_open from process `importer`: one descriptor per piece in `fds` (the caller sends and closes them).
std::variant<control::ipc_open_reply, control::failure_reply> open_export(const control::ipc_open_request& request,
                                                                          pid_t importer, std::vector<int>& fds);
// ipc_close from process `importer`.
void close_export(const control::ipc_close_request& request, pid_t importer);

// The processes that map this process's memory through IPC now (those that exited or closed are dropped).
std::vector<pid_t> live_importers();

}  // namespace vmmckpt::detail
