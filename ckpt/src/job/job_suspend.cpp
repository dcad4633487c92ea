// cuda-ckpt suspend --job: the cut, every rank's image written and checked, the job's claim accepted once all are,
// then every rank gives its GPU memory back. All of them or none (docs/job-checkpoint.md).
#include <unistd.h>

#include "base/image_files.hpp"
#include "job/cut_coordinator.hpp"
#include "job/job_run.hpp"
#include "job/rendezvous.hpp"
#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

// Each rank that is no longer there as the job's suspend needs it, a line each ("\n  process PID: WHY"): it has
// exited (its start time is not the one it had), it is stopped, or (`late`, once asked) it did not confirm its
// suspend. "" when every rank is there.
std::string ranks_in_trouble(const std::vector<pid_t>& ranks, const std::vector<std::uint64_t>& started,
                             const std::vector<suspend_result>& results) {
  std::string lines;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    std::string why = suspend_claim::start_time(ranks[i]) != started[i] ? "it has exited" : why_silent(ranks[i]);
    if (why.empty() && results[i].late) why = "it took the suspend but did not confirm it in time";
    if (!why.empty()) lines += "\n  process " + std::to_string(ranks[i]) + ": " + why;
  }
  return lines;
}

// What the job is left as, once accepted, when not every rank confirmed its suspend (docs/job-checkpoint.md).
[[noreturn]] void accepted_but(const std::string& troubled, const fs::path& output) {
  throw tool_error("the job's suspend was accepted, but not every rank is suspended as it should be:" + troubled +
                   "\nEvery other rank is suspended; a stopped rank suspends itself on its image in " +
                   output.string() +
                   " once it is continued (its memory stays until then). `cuda-ckpt resume --job` brings the job "
                   "back once every rank runs again; a rank that has exited cannot come back, and its job is "
                   "lost (its launcher ends it)");
}

// The job's claim, pending, in its image directory: whoever renames it first, the acceptance once every rank's
// image is complete or a withdrawal, decides for every rank (suspend_claim.hpp). It names the job by its launcher,
// or by its first rank.
void write_job_claim(const fs::path& output, const job_suspend_options& o, const std::vector<pid_t>& ranks) {
  const pid_t named = o.job.ranks.empty() ? o.job.root : ranks.front();
  image_files::write_synced(output, suspend_claim::job_pending,
                            suspend_claim::encode({::getpid(), suspend_claim::start_time(::getpid()), named,
                                                   suspend_claim::start_time(named), ""}));
}

// Until the job's claim is accepted, a failure withdraws it and removes the images.
struct remove_unless_accepted {
  const fs::path& output;
  bool accepted = false;
  ~remove_unless_accepted() {
    if (accepted) return;
    suspend_claim::take_job(output.string(), suspend_claim::job_cancelled);
    std::error_code ec;
    fs::remove_all(output, ec);
  }
};

// Every rank's image complete and checked: the job is described, then its claim accepted. From the acceptance on,
// a rank whose tool goes away suspends itself.
void accept_job(const fs::path& output, job_image& j, const job_suspend_result& r,
                const std::vector<std::uint64_t>& started, remove_unless_accepted& claim) {
  // A rank that exited or was stopped while held would not take its suspend: the job is not suspended at all.
  if (const std::string troubled = ranks_in_trouble(r.ranks, started, r.suspends); !troubled.empty())
    throw tool_error("not every rank can be suspended:" + troubled +
                     "\nThe job's suspend is given up: no rank is suspended, every other one goes on");
  j.cut_seconds = r.cut.seconds;
  j.cut_rounds = r.cut.rounds;
  write_job_manifest(output, j);
  if (!suspend_claim::take_job(output.string(), suspend_claim::job_accepted))
    throw tool_error("the job's suspend was cancelled meanwhile (a rank's hold ended: its deadline passed, or it "
                     "lost its connection); every rank goes on, none suspended");
  claim.accepted = true;
}

// What a failure after the acceptance leaves: no rank refuses any more, and one that did not answer suspends
// itself on its image (the images stay). Only its figures are missing.
[[noreturn]] void failed_after_acceptance(const std::exception& e, const fs::path& output) {
  throw tool_error(std::string(e.what()) + "; the job's suspend was accepted, so every rank is suspended or " +
                   "suspends itself on its image in " + output.string() + " (`cuda-ckpt ps` shows them; " +
                   "`cuda-ckpt resume --job` brings the job back)");
}

// The job's description: the ranks in order, each with its image's id once written.
job_image job_description(const job_suspend_options& o, const std::vector<pid_t>& ranks) {
  job_image j;
  j.kind = "suspend";
  j.root_pid = o.job.ranks.empty() ? o.job.root : 0;
  for (const pid_t pid : ranks) j.ranks.push_back({pid, {}});
  return j;
}

}  // namespace

job_suspend_result suspend_job(const job_suspend_options& o) {
  using clock = std::chrono::steady_clock;
  job_suspend_result r;
  const auto start = clock::now();
  r.ranks = running_ranks(o.job, o.hold_deadline);
  // A rank that ends meanwhile is told apart from a new process given its pid.
  std::vector<std::uint64_t> started;
  for (const pid_t pid : r.ranks) started.push_back(suspend_claim::start_time(pid));
  // The ranks are told where their images will be, for good: the directory has its final name from the start.
  const fs::path output = new_image_path(o.output);
  make_private_directory(output);
  write_job_claim(output, o, r.ranks);
  remove_unless_accepted claim{output};

  const deadline until(start + o.hold_deadline);
  job_cut cut(r.ranks, until, r.cut);
  job_image j = job_description(o, r.ranks);
  rendezvous complete(r.ranks.size(), [&] { accept_job(output, j, r, started, claim); });
  r.suspends.resize(r.ranks.size());
  const std::vector<std::int64_t> job_pids(r.ranks.begin(), r.ranks.end());
  try {
    run_per_rank(r.ranks, {&cut.prepared, &complete}, [&](std::size_t i) {
      auto s = rank_options<suspend_options>(o, r.ranks[i], output);
      s.verify = o.verify;
      s.job = control::job_suspend{output.string(), {}, {}, job_pids};
      s.before_hold = [&] { cut.prepared.arrive_and_wait(); };
      s.before_suspend = [&, i](const image::manifest& m) {
        j.ranks[i].image_id = m.image_id;  // each thread its own entry; the manifest is written by the last
        if (i == 0) {
          j.tool_version = m.tool_version;
          j.created = m.created;
          j.host = m.host;
        }
        complete.arrive_and_wait();
      };
      r.suspends[i] = suspend(s);
    });
  } catch (const std::exception& e) {
    if (cut.coordinator) cut.coordinator->release();
    if (!claim.accepted) throw;
    failed_after_acceptance(e, output);
  }
  cut.coordinator->release();  // each rank's NCCL calls now wait for its resume
  // A rank that did not answer its suspend request, or that exited or was stopped after it, is said: the command
  // fails, naming it, and says what the job is left as.
  if (const std::string troubled = ranks_in_trouble(r.ranks, started, r.suspends); !troubled.empty())
    accepted_but(troubled, output);
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    r.freed_bytes += r.suspends[i].freed_bytes;
  }
  r.image = output;
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

}  // namespace vmmckpt::ckpt
