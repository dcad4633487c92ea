// `cuda-ckpt run`: start a command with libvmmckpt.so preloaded.
#pragma once

#include <string>
#include <vector>

namespace vmmckpt::tools {

// Where libvmmckpt.so is: $VMMCKPT_SHIM, else ../lib/libvmmckpt.so next to
// this executable (the build tree and an installed prefix share that layout).
std::string locate_shim();

// Replaces this process with the command under the shim; returns only on
// failure, with the exit code to use (the reason is printed).
int run_under_shim(const std::vector<std::string>& command);

}  // namespace vmmckpt::tools
