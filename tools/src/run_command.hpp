// `cuda-ckpt run`: start a command with libvmmckpt.so preloaded.
#pragma once

#include <string>
#include <vector>

namespace vmmckpt::tools {

// Where libvmmckpt.so is: $VMMCKPT_SHIM, else ../lib/libvmmckpt.so next to
// this executable (the build tree and an installed prefix share that layout).
std::string locate_shim();

// Ignores SIGXFSZ in this tool: under a file-size limit (ulimit -f) a write then fails with EFBIG,
// which the image writer reports and cleans up after, instead of killing the tool mid-image. The
// disposition found is put back before run_under_shim execs a command, which inherits it.
void ignore_file_size_signal();

// Replaces this process with the command under the shim; returns only on
// failure, with the exit code to use (the reason is printed).
int run_under_shim(const std::vector<std::string>& command);

}  // namespace vmmckpt::tools
