// The program pausing its own GPU memory (vmmckpt_pause / vmmckpt_resume, shim/include/vmmckpt/vmmckpt.h).
#pragma once

namespace vmmckpt::detail {

// True between a vmmckpt_pause() and its vmmckpt_resume(): cuda-ckpt's dump, suspend and resume refuse then.
bool is_self_paused() noexcept;

}  // namespace vmmckpt::detail
