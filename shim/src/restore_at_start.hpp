// Restoring an image into a new process: at its first memory call, the image's allocations come back at their addresses.
#pragma once

namespace vmmckpt::detail {

// True when there is nothing (more) to restore. In a process started by
// `cuda-ckpt restore`, the first call performs the restore (every thread waits
// for it); false from then on if it failed, and memory calls then fail.
bool restore_ready() noexcept;

}  // namespace vmmckpt::detail
