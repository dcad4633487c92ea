// `cuda-ckpt run`: start a command with libvmmckpt.so preloaded.
#pragma once

#include <string>
#include <vector>

namespace vmmckpt::tools {

// The places libvmmckpt.so may be, in order: $VMMCKPT_SHIM alone when set; else, relative to this
// executable's real directory, ../lib (the build tree, and an install with lib/), the install's own
// library directory (lib64, ...), then ../lib/<multiarch> (Debian's layout).
std::vector<std::string> shim_candidates();

// The first readable one of shim_candidates(), or "" when none is.
std::string locate_shim();

// Ignores SIGXFSZ in this tool: under a file-size limit (ulimit -f) a write then fails with EFBIG,
// which the image writer reports and cleans up after, instead of killing the tool mid-image. The
// disposition found is put back before run_under_shim execs a command, which inherits it.
void ignore_file_size_signal();

// Replaces this process with the command under the shim; returns only on
// failure, with the exit code to use (the reason is printed, as `cuda-ckpt <subcommand>: ...`).
int run_under_shim(const std::vector<std::string>& command, const char* subcommand = "run");

}  // namespace vmmckpt::tools
