// Emulator settings read once from the environment (VMMCKPT_EMU_DEVICES, VMMCKPT_EMU_MEM,
// VMMCKPT_EMU_NO_P2P, VMMCKPT_EMU_DIRTY_MEMORY, VMMCKPT_EMU_TRACE) and the stderr trace used to report what the emulator does not implement.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmckpt::emu {

inline constexpr int max_devices = 8;
// The real driver's granularity on Hopper: minimum and recommended are both 2 MiB.
inline constexpr std::size_t granularity = std::size_t{2} << 20;

struct config {
  int device_count = 1;  // devices the process sees (after CUDA_VISIBLE_DEVICES)
  int physical[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};  // visible ordinal -> emulated device
  std::uint64_t device_memory = std::uint64_t{16} << 30;
  bool peer_to_peer = true;  // VMMCKPT_EMU_NO_P2P=1: no pair of devices can access each other
  // VMMCKPT_EMU_DIRTY_MEMORY=1: device memory from cuMemCreate starts as 0xa5 bytes, not zeros, as a real
  // GPU's may (memory another process freed): a restore that relies on fresh memory being zero shows.
  bool dirty_memory = false;
  bool trace = false;
};

// Parsed on first use; later changes to the environment are ignored, like a real driver's settings.
const config& settings();

// Parses "123", "4K", "16G", "1T" (binary units); returns false on anything else.
bool parse_size(const char* text, std::uint64_t& out);

// printf-style line on stderr, only when VMMCKPT_EMU_TRACE is set.
void trace(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace vmmckpt::emu
