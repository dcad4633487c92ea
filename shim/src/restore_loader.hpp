// Restoring an image into a new process: at its first memory call, the image's allocations come back at their addresses.
#pragma once

#include <cstdint>
#include <string>

namespace vmmckpt::detail {

// True when there is nothing (more) to restore. In a process started by
// `cuda-ckpt restore`, the first call performs the restore (every thread waits
// for it); false from then on if it failed, and memory calls then fail.
bool restore_ready();

// Resume of a suspended program: physical memory back under every pool's
// live blocks, filled from the image suspend wrote. On failure the pools are
// left without physical memory again (still suspended) and `error` says why.
bool refill_pools_from_image(const std::string& path, std::string& error, std::uint64_t& bytes);

}  // namespace vmmckpt::detail
