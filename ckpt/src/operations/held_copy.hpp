// The hold that dump and suspend share: from the cut to every byte of the held program copied out.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>

#include "channel/session.hpp"
#include "copy/copy_pipeline.hpp"
#include "copy/held_memory.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/copy_settings.hpp"
#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::ckpt {

// What one operation asks of the hold: how the program is held (dump_begin, the handles into `fds`), whether
// memory vmmckpt does not own is allowed, and what is done once every byte has left the program's memory (this
// tool's mapping of it is still there for `release` to undo).
struct hold_steps {
  std::function<control::dump_begin_reply(received_fds& fds)> hold;
  bool allow_partial = false;
  std::function<void()> before_hold;
  std::function<void(held_memory& memory)> release;
};

// The running program's session for `what` ("dump", "suspend"), once this tool is known to have a driver (said
// before the program is touched). The deadline covers everything up to the hold's end.
session connect_to_hold(pid_t pid, const char* what, std::chrono::milliseconds hold_deadline,
                        const image_result& result);

// Holds the program once everything is prepared (the job's cut, `before_hold`, comes just before), maps its
// memory, describes it in result.manifest and copies it out through `pipeline`. Returns once every byte is
// written; the manifest is not committed.
copy_outcome copy_held(session& s, copy_pipeline& pipeline, const hold_steps& steps, const progress_callback& progress,
                       image_result& result);

// The operation's end: its image, and its time from the start.
void finish(image_result& result, const std::filesystem::path& image);

}  // namespace vmmckpt::ckpt
