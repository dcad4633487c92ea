// cuda-ckpt resume --job: every suspended rank loads its memory, still held; then each maps the others' memory
// again and goes on (docs/job-checkpoint.md). Run again, it finishes what a resume whose tool died left.
#include <chrono>

#include "job/job_run.hpp"
#include "job/rendezvous.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/deadlines.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/fault_point.hpp"

namespace vmmckpt::ckpt {
namespace {

// The ranks a resume that did not complete waits for, a line each: those that are stopped, and why.
std::string silent_ranks(const std::vector<pid_t>& ranks) {
  std::string lines;
  for (const pid_t pid : ranks)
    if (const std::string why = why_silent(pid); !why.empty())
      lines += "\n  process " + std::to_string(pid) + ": " + why;
  return lines.empty() ? lines : "\nThe job's resume waits for:" + lines;
}

// Loads a rank's memory, still held; false when the rank is running by now: listed suspended, it was still
// finishing an earlier resume --job (one whose tool gave up on a stopped rank), and that finish has completed.
bool load_rank(pid_t rank, const std::filesystem::path& image, deadline until, resume_result& result) {
  try {
    result = request_resume(rank, image, {}, "resume", nullptr, control::resume_request::stage::load, {}, until);
    return true;
  } catch (const tool_error&) {
    // Refused as not suspended, at the connection or by the program: gone on only if it runs now.
    const auto now = list_processes(rank, member_wait);
    if (now.empty() || !now.front().hello || now.front().hello->state != control::process_state::running) throw;
    return false;
  }
}

}  // namespace

job_resume_result resume_job(const job_spec& job, const std::filesystem::path& images,
                             std::chrono::milliseconds resume_deadline) {
  using clock = std::chrono::steady_clock;
  using stage = control::resume_request::stage;
  const auto start = clock::now();
  const deadline until(start + resume_deadline);  // both stages, every rank
  job_resume_result r;
  // A member that does not answer (stopped) fails the command within its deadline.
  const auto wait = member_wait_within(resume_deadline);
  r.ranks = job_members(job, member_state::suspended, wait);
  // Every rank of the job, those already running too: a rank maps their memory again as well, and after a restore
  // their start times changed.
  const std::vector<pid_t> all = job_members(job, member_state::any, wait);
  const std::vector<std::int64_t> pids(all.begin(), all.end());
  r.resumes.resize(r.ranks.size());
  // A rank goes on only once every rank's memory is back: its first collective reads and writes the others'.
  rendezvous loaded(r.ranks.size(), [] { fault_point("job:loaded"); });
  try {
    run_per_rank(r.ranks, {&loaded}, [&](std::size_t i) {
      const std::filesystem::path image =
          images.empty() ? std::filesystem::path() : images / std::to_string(r.ranks[i]);
      const bool went_on = !load_rank(r.ranks[i], image, until, r.resumes[i]);
      loaded.arrive_and_wait();
      if (went_on) return;
      const auto finished = request_resume(r.ranks[i], {}, {}, "resume", nullptr, stage::finish, pids, until);
      if (r.resumes[i].image.empty()) r.resumes[i].image = finished.image;
    });
  } catch (const interrupted&) {
    throw;
  } catch (const std::exception& e) {
    // A request that waited in a stopped rank's socket past the deadline is refused when it goes on, never acted
    // on late.
    throw tool_error(std::string(e.what()) + silent_ranks(r.ranks) +
                     "\nThe ranks that loaded their memory stay suspended with it, and those that went on run: "
                     "`cuda-ckpt resume --job` again finishes what is left");
  }
  for (const auto& x : r.resumes) r.bytes += x.bytes;
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

}  // namespace vmmckpt::ckpt
