// One process's GPU side of a whole-process checkpoint that CRIU runs itself, through the CRIU plugin
// (criu/): its GPU memory suspended into a part of CRIU's image, what is left of its context checkpointed by
// the driver. The way back is restore/tool's restore_gpu_side (docs/containers.md).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::ckpt {

// Whether `pid` runs under the shim with its control server up: a process whose GPU side is ours. False for
// a process without the shim or without a control server yet (no CUDA call); tool_error for one of ours
// that does not answer (stopped, or stuck), which must not be dumped without its GPU side.
bool has_gpu_side(pid_t pid);

// Suspends the process's GPU memory into `gpu_image` (memory the shim does not own stays in its context),
// then has the driver lock and checkpoint its context. Refused for a process that maps another's memory
// (its mapping would be in the driver's checkpoint, that memory not in the image). On failure what was
// done is undone (the process runs on, its memory back) and tool_error or driver_unavailable is thrown.
suspend_result checkpoint_gpu_side(pid_t pid, const std::filesystem::path& gpu_image,
                                   std::chrono::milliseconds hold_deadline);

}  // namespace vmmckpt::ckpt
