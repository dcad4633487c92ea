// What the operations on a whole job share: their image directory, and one thread per rank that meet at the
// job's rendezvous points.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "job/rendezvous.hpp"
#include "vmmckpt/ckpt/job.hpp"

namespace vmmckpt::ckpt {

// The absolute path of an image directory to create: refused (image::image_error) when it exists or names no
// directory.
std::filesystem::path new_image_path(const std::filesystem::path& given);
// Creates it, readable by its owner only.
void make_private_directory(const std::filesystem::path& dir);

// The ranks of a job's dump or suspend, every one running. The driver is checked first: without one, that is said
// before any rank is touched. A member that does not answer (stopped) fails the command within `hold_deadline`.
std::vector<pid_t> running_ranks(const job_spec& job, std::chrono::milliseconds hold_deadline);

// One rank's options of a job's dump or suspend (Options: dump_options, suspend_options), from what every rank
// shares: its image is DIR/PID.
template <class Options, class JobOptions>
Options rank_options(const JobOptions& o, pid_t pid, const std::filesystem::path& dir) {
  Options r;
  r.pid = pid;
  r.output = dir / std::to_string(pid);
  r.copy = o.copy;
  r.hold_deadline = o.hold_deadline;
  r.allow_partial = o.allow_partial;
  return r;
}

// Runs body(i) for each rank i in a thread of its own. A body that throws makes every rendezvous give up, so that
// no other rank waits for it; once all are done, the first error that says why (not that another rank failed) is
// thrown again.
void run_per_rank(const std::vector<pid_t>& ranks, std::initializer_list<rendezvous*> meetings,
                  const std::function<void(std::size_t)>& body);

}  // namespace vmmckpt::ckpt
