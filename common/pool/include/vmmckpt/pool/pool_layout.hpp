// Where pools live and how they are placed: the constants every part of vmmckpt agrees on.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace vmmckpt {

// Device d's pool is [base + d * size, base + (d + 1) * size). These values are
// part of the image contract: changing a default moves every address.
inline constexpr std::uint64_t default_pool_base = 0x200000000000ULL;  // 32 TiB
inline constexpr std::uint64_t default_pool_size = 512ULL << 30;       // 512 GiB per device
inline constexpr int max_devices = 16;

// Placement never depends on the GPU model: alignments are fixed here, not read
// from the driver. Small blocks get 512 bytes (cudaMalloc promises 256); blocks
// of 2 MiB and more start on a 2 MiB boundary so they touch as few handles as
// possible.
inline constexpr std::uint64_t small_alignment = 512;
inline constexpr std::uint64_t large_alignment = 2ULL << 20;

// Small blocks (rounded size under small_block_limit) are placed only in small-block chunks:
// stretches of small_chunk_size on a grid from the pool's base, holding small blocks only.
// Larger blocks are placed outside them and start on a 2 MiB boundary, so no two share a
// granule: the physical memory under one is its own and goes back when it is freed, while
// small blocks share a few handles.
inline constexpr std::uint64_t small_block_limit = large_alignment;
inline constexpr std::uint64_t small_chunk_size = 64ULL << 20;

// Physical memory policy (see docs/pool.md).
inline constexpr std::uint64_t default_growth_step = 64ULL << 20;
inline constexpr std::uint64_t default_retain_bytes = 256ULL << 20;
// Freed small blocks each thread keeps for its own next allocations, per device (0: none).
inline constexpr std::uint64_t default_thread_cache_bytes = 2ULL << 20;

// The variables that place the pools (read by pool_config_from_env; set by `cuda-ckpt restore` for the
// process it starts, so that its pools land where the image's were).
inline constexpr const char* env_pool_base = "VMMCKPT_POOL_BASE";
inline constexpr const char* env_pool_size = "VMMCKPT_POOL_SIZE";

struct pool_config {
  std::uint64_t base = default_pool_base;
  std::uint64_t size = default_pool_size;
  std::uint64_t growth_step = default_growth_step;
  std::uint64_t retain_bytes = default_retain_bytes;
  std::uint64_t thread_cache_bytes = default_thread_cache_bytes;

  std::uint64_t device_base(int ordinal) const { return base + static_cast<std::uint64_t>(ordinal) * size; }
};

// Where the shim places the reservations a program makes itself (cuMemAddressReserve, docs/vmm.md):
// device d's window is [base + d * window, base + (d + 1) * window). By default the 16 windows lie
// above the 16 pools (which end at 0x280000000000) and end at 0x500000000000. Part of the same contract
// as the pool's addresses: changing a default moves every program-made reservation.
inline constexpr std::uint64_t default_vmm_base = 0x300000000000ULL;  // 48 TiB
inline constexpr std::uint64_t default_vmm_window = 2ULL << 40;       // 2 TiB per device
inline constexpr const char* env_vmm_base = "VMMCKPT_VMM_BASE";
inline constexpr const char* env_vmm_window = "VMMCKPT_VMM_WINDOW";

// Where the shim maps memory that other processes share with this one over legacy CUDA IPC (docs/ipc.md):
// above the VMM windows. Only a hint to the driver, and not part of the image contract: imported memory is
// another process's, never in this one's images.
inline constexpr std::uint64_t default_ipc_import_base = 0x500000000000ULL;  // 80 TiB
inline constexpr std::uint64_t default_ipc_import_size = 4ULL << 40;

// A sibling of pool_config rather than more fields of it: a bad VMM value must not take the pools
// down with it (it disables only program-made reservations), so it is read and checked on its own.
struct vmm_config {
  std::uint64_t base = default_vmm_base;
  std::uint64_t window = default_vmm_window;

  std::uint64_t device_base(int ordinal) const { return base + static_cast<std::uint64_t>(ordinal) * window; }
};

// Parses "0x1f", "4096", "64M", "2G", "1T" (binary units). Returns false on
// anything else, on overflow, and on an empty string.
bool parse_size(std::string_view text, std::uint64_t& out);

// Reads VMMCKPT_POOL_BASE, VMMCKPT_POOL_SIZE, VMMCKPT_GROWTH_STEP, VMMCKPT_POOL_RETAIN and
// VMMCKPT_THREAD_CACHE. On a bad value, `error` names the variable and why, and
// the returned config must not be used.
pool_config pool_config_from_env(std::string& error);

// Checks a config for values no pool can use; returns an empty string when good.
std::string validate(const pool_config& config);

// Reads VMMCKPT_VMM_BASE and VMMCKPT_VMM_WINDOW. On a bad value, or windows that overlap the pools of
// `pools`, `error` names the variable and why, and the returned config must not be used.
vmm_config vmm_config_from_env(const pool_config& pools, std::string& error);
std::string validate(const vmm_config& config, const pool_config& pools);

constexpr std::uint64_t align_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
constexpr std::uint64_t align_down(std::uint64_t value, std::uint64_t alignment) {
  return value / alignment * alignment;
}

}  // namespace vmmckpt
