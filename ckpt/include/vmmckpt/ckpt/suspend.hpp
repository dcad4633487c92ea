// Suspend (save a live process's GPU memory, then free it) and the request that gives it back.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "vmmckpt/protocol/control_messages.hpp"

#include "vmmckpt/ckpt/deadlines.hpp"
#include "vmmckpt/ckpt/dump.hpp"

namespace vmmckpt::ckpt {

struct suspend_options {
  pid_t pid = 0;
  std::filesystem::path output;  // the image directory to create
  copy_settings copy;
  std::chrono::milliseconds hold_deadline{default_suspend_hold};  // released, not suspended, when saving takes longer
  // Read the whole image back and check every checksum before the memory is freed.
  bool verify = false;
  // As dump_options::allow_partial. The memory vmmckpt does not own stays on the GPU while suspended.
  bool allow_partial = false;
  // A rank of a job's suspend (job.hpp): what the program is told with its hold (the job's claim decides for
  // every rank; the image and image_id are this suspend's, filled in here), called just before it is held (the job's cut), and once its image is complete and checked, just
  // before the suspend is asked for (the job's claim is accepted there, once every rank is that far). Either may
  // throw to give the suspend up.
  std::optional<control::job_suspend> job;
  std::function<void()> before_hold;
  std::function<void(const image::manifest& m)> before_suspend;
};

struct suspend_result : image_result {
  std::uint64_t freed_bytes = 0;        // GPU memory the program gave back
  std::uint64_t device_used_after = 0;  // bytes still in use on its device(s)
  // The program took the suspend but its answer did not come in time (it was stopped right after,
  // say): it is suspended with this image, or will be when it continues; the figures are unknown.
  bool late = false;
};

// Holds the program until its image is written, synced and checked, then has it give back its
// GPU memory; it waits for resume. On any failure nothing that looks like an image is left and
// the program runs on, its memory untouched.
suspend_result suspend(const suspend_options& options, const progress_callback& progress = {});

struct resume_result {
  std::uint64_t bytes = 0;
  double seconds = 0;  // as the program measured it
  std::string image;
};

// The request that ends a suspend: asks the suspended program to take its GPU memory back from `image` (empty:
// where its suspend wrote it) and waits while it loads. `verb` names the command in messages; `recorded`, when
// given, receives where the suspend wrote its image (from the program's hello) before the request goes out.
// The program takes only the image its suspend wrote, and refuses another (control_error). The resume users
// run, which also looks for an image renamed since, is restore/tool's (vmmckpt/restore/tool/resume.hpp).
// A job's resume asks in two stages (control::resume_request::stage), naming the job's ranks for the second.
// `until`: when the tool gives up waiting (none: restore_resume_deadline from now, for the resume that ends a restore); the
// request is stamped valid until then, so that a program stopped meanwhile refuses it once continued, and stays
// suspended (control_error saying which process it waited for, and why it is silent when it is stopped).
resume_result request_resume(pid_t pid, const std::filesystem::path& image, const progress_callback& progress = {},
                             const char* verb = "resume", std::filesystem::path* recorded = nullptr,
                             control::resume_request::stage stage = control::resume_request::stage::both,
                             const std::vector<std::int64_t>& ranks = {}, std::optional<deadline> until = std::nullopt);

// A user's default suspend directory, /dev/shm/vmmckpt-UID (not created here).
std::filesystem::path suspend_dir_of(uid_t uid);

// Where suspend puts images by default: a private directory of this user's on /dev/shm (created,
// and checked to be ours and closed to others; a tool_error otherwise).
std::filesystem::path default_suspend_dir();

}  // namespace vmmckpt::ckpt
