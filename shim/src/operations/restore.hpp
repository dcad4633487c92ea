// The process's side of every restore: an image restored into a new process at its first memory call, and
// a suspended program resumed from the image its suspend took. (The tool's side is restore/ and
// tools/src/restore_command.cpp.)
#pragma once

#include <variant>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/restore/upload.hpp"

namespace vmmckpt::detail {

// True when there is nothing (more) to restore. In a process started by
// `cuda-ckpt restore`, the first call performs the restore (every thread waits
// for it); false from then on if it failed, and memory calls then fail.
bool restore_ready() noexcept;

// resume: the pools' memory back from the suspend image (the very image suspend took: the same
// directory and image_id), and the program goes on. A failure_reply when it cannot; the program then
// stays suspended with its image. `progress` hears of the bytes loaded as they load.
// A job's resume (docs/job-checkpoint.md) comes in two stages: `load` brings the memory back and leaves the program
// held (suspended, its memory loaded); `finish` maps the other ranks' memory again and lets it go on. A request
// without a stage does both.
std::variant<control::resume_reply, control::failure_reply> resume(const control::resume_request& request,
                                                                   const restore::upload_progress& progress = {});
// Between the two stages: the memory is back, and nothing gives it back until the program runs again.
bool memory_loaded_while_suspended() noexcept;

}  // namespace vmmckpt::detail
