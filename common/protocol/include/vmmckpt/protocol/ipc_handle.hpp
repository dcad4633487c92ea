// The 64 bytes of a legacy CUDA IPC memory handle (CUipcMemHandle) for memory the shim owns: which process
// exported it, which allocation, and which export of that allocation (docs/ipc.md).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace vmmckpt {

inline constexpr std::size_t ipc_handle_size = 64;  // sizeof(CUipcMemHandle)

struct ipc_handle {
  pid_t exporter_pid = 0;
  std::uint64_t exporter_start = 0;  // the exporter's start time (suspend_claim::start_time): a reused pid is not it
  std::uint64_t base = 0;            // the allocation's base in the exporter
  std::uint64_t size = 0;            // the allocation's size as the program asked for it
  std::uint64_t generation = 0;      // the export's number in the exporter: a freed allocation's handle stays stale
  friend bool operator==(const ipc_handle&, const ipc_handle&) = default;
};

// Fills all 64 bytes: a magic, the fields little-endian, a check value over them, zeros.
void encode_ipc_handle(const ipc_handle& handle, unsigned char (&out)[ipc_handle_size]) noexcept;
// The handle those bytes name, or nothing when they are not one of ours (another magic, a wrong check value):
// such bytes are the driver's own handle, or garbage.
std::optional<ipc_handle> decode_ipc_handle(const unsigned char (&in)[ipc_handle_size]) noexcept;

}  // namespace vmmckpt
