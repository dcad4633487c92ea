// cuda-ckpt resume --job: every suspended rank loads its memory, still held; then each maps the others' memory
// again and goes on (docs/job-checkpoint.md). Run again, it finishes what a resume whose tool died left.
#include <chrono>

#include "job/job_run.hpp"
#include "job/rendezvous.hpp"
#include "vmmckpt/ckpt/job.hpp"

namespace vmmckpt::ckpt {

job_resume_result resume_job(const job_spec& job, const std::filesystem::path& images) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  job_resume_result r;
  r.ranks = job_members(job, member_state::suspended);
  // Every rank of the job, those already running too: a rank maps their memory again as well, and after a restore
  // their start times changed.
  const std::vector<pid_t> all = job_members(job, member_state::any);
  const std::vector<std::int64_t> pids(all.begin(), all.end());
  r.resumes.resize(r.ranks.size());
  // A rank goes on only once every rank's memory is back: its first collective reads and writes the others'.
  rendezvous loaded(r.ranks.size());
  try {
    run_per_rank(r.ranks, {&loaded}, [&](std::size_t i) {
    const std::filesystem::path image = images.empty() ? std::filesystem::path() : images / std::to_string(r.ranks[i]);
    r.resumes[i] = request_resume(r.ranks[i], image, {}, "resume", nullptr, control::resume_request::stage::load);
    loaded.arrive_and_wait();
    const auto finished =
        request_resume(r.ranks[i], {}, {}, "resume", nullptr, control::resume_request::stage::finish, pids);
    if (r.resumes[i].image.empty()) r.resumes[i].image = finished.image;
    });
  } catch (const interrupted&) {
    throw;
  } catch (const std::exception& e) {
    throw tool_error(std::string(e.what()) +
                     "; the ranks that loaded their memory stay suspended with it, and those that went on run: "
                     "`cuda-ckpt resume --job` again finishes what is left");
  }
  for (const auto& x : r.resumes) r.bytes += x.bytes;
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

}  // namespace vmmckpt::ckpt
