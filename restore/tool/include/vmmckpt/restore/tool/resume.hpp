// cuda-ckpt resume PID: a suspended program takes its GPU memory back and goes on.
#pragma once

#include <sys/types.h>

#include <filesystem>

#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/ckpt/deadlines.hpp"

namespace vmmckpt::restore {

// Gives a suspended program its GPU memory back from its image and lets it go on. `image`: where that image is
// now (a whole-process dump's GPU part, renamed with its image); empty: where its suspend wrote it, else
// under another of its names (process_recovery.hpp). The program takes only the image its suspend wrote.
// Everything within `resume_deadline` from now (--deadline); past it, a control_error names the process and why it
// is silent.
ckpt::resume_result resume(pid_t pid, const ckpt::progress_callback& progress = {},
                           const std::filesystem::path& image = {},
                           std::chrono::milliseconds resume_deadline = ckpt::default_resume_deadline);

}  // namespace vmmckpt::restore
