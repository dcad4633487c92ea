// The claim file that settles a suspend between cuda-ckpt and the program, whatever stops or dies on the way.
//
// The suspend image holds `suspend.pending` from the moment it appears. The program acts on a suspend
// request only by renaming it to `suspend.accepted`; a tool that gives up waiting (or `cuda-ckpt gc`
// for a tool that died) withdraws the request by renaming it to `suspend.cancelled`. A rename of the
// same file succeeds once: whoever wins decides, and the loser learns it from its failed rename. So a
// program is never suspended on an image that anyone deletes, and an image nobody depends on is known
// to be one (docs/protocol.md, "suspend").
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace vmmckpt::suspend_claim {

inline constexpr const char* pending = "suspend.pending";
inline constexpr const char* accepted = "suspend.accepted";
inline constexpr const char* cancelled = "suspend.cancelled";

// Who made the claim and for whom; processes are named with their start time, so that a reused pid
// is not taken for them.
struct parties {
  pid_t tool_pid = 0;
  std::uint64_t tool_start = 0;
  pid_t target_pid = 0;
  std::uint64_t target_start = 0;
  std::string image_id;
};

std::string encode(const parties& p);
bool decode(const std::string& text, parties& out) noexcept;

// Renames image/pending to image/`to`: true when this caller won the claim, false when someone
// else had already renamed it (or it is not there).
bool take(const std::string& image, const char* to) noexcept;

// A whole job's suspend (docs/job-checkpoint.md) is settled the same way, once for all of its ranks, by the
// claim in the job's directory: the tool accepts it once every rank's image is complete, and a rank whose tool
// went away before telling it cancels it, or, finding it accepted, suspends itself as the others are.
inline constexpr const char* job_pending = "job.pending";
inline constexpr const char* job_accepted = "job.accepted";
inline constexpr const char* job_cancelled = "job.cancelled";
// Renames dir/job.pending to dir/`to` (job_accepted or job_cancelled), as take() does.
bool take_job(const std::string& dir, const char* to) noexcept;

// A process's start time in clock ticks since boot (/proc/PID/stat), or 0 when it is gone (a zombie too).
std::uint64_t start_time(pid_t pid) noexcept;
// The process runs and is the one that started at `start`.
bool alive(pid_t pid, std::uint64_t start) noexcept;

}  // namespace vmmckpt::suspend_claim
