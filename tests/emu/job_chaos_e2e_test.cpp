// Chaos for whole-job checkpoints (issue 49): rounds of `dump --job`, `suspend --job` and `resume --job` against a
// 3-rank collective job, with the tool killed or stopped, a rank stopped for a while or killed, at random moments.
// After every operation the job must settle all running or all suspended (a suspended job resumes), every image a
// dump called complete must verify, and every round must end with the job's results those of a run without the
// shim, or the whole job gone when a rank was killed: zero stuck (docs/reliability.md, "Chaos, jobs").
#include <algorithm>
#include <random>

#include "job_support.hpp"

namespace vmmckpt::test {
namespace {

struct job_chaos_figures {
  int rounds = 0, operations = 0, completed = 0;
  int tool_kills = 0, tool_stops = 0, rank_stops = 0, rank_kills = 0;
  int refused_stopped = 0;   // operations that refused a stopped rank, saying so
  int resumed_after = 0;     // suspended jobs resumed by the test after an operation
  int images_checked = 0;    // images dump --job called complete, verified
  int jobs_ended_whole = 0;  // rounds whose job ended with the reference results
  std::vector<std::string> failures;
};

constexpr int job_ranks = 3, job_devices = 2, job_steps = 300, job_step_ms = 10;

class job_chaos_round {
 public:
  job_chaos_round(std::uint64_t seed, job_chaos_figures& f) : rng_(seed), f_(f) {}

  void run() {
    collective_job job(job_ranks, job_devices, job_steps, job_step_ms);
    job_ = &job;
    const int steps = 2 + static_cast<int>(rng_() % 3);
    for (int step = 1; step <= steps && !gave_up_ && !rank_killed_ && job.results().empty(); ++step) {
      operate(step);
      if (!gave_up_) settle();
    }
    if (!gave_up_) finish();
    job_ = nullptr;
  }

 private:
  void fail(const std::string& what) {
    f_.failures.push_back("round with job " + job_->id() + ": " + what + "\n(operations: " + history_ +
                          ")\n(the job's output, its end: " + tail(job_->output()) + ")");
    gave_up_ = true;
  }

  static std::string tail(const std::string& text) { return text.substr(text.size() > 1500 ? text.size() - 1500 : 0); }

  std::string states() const {
    std::string out;
    for (const auto& s : rank_states(*job_)) out += (out.empty() ? "" : ", ") + s;
    return out;
  }

  // One operation: a resume when the job is suspended, else a dump or a suspend, into the job's scratch directory.
  void operate(int step) {
    std::vector<std::string> args;
    fs::path image;
    if (suspended_) {
      args = {"resume", "--job", job_->id()};
    } else {
      const bool dump = rng_() % 2 == 0;
      image = job_->dir.path / ((dump ? "dump-" : "suspend-") + std::to_string(step));
      args = {dump ? "dump" : "suspend", "--job", job_->id(), "-o", image.string()};
    }
    const auto r = tool_with_fate(args);
    if (r.exit_code != 0) return;
    ++f_.completed;
    if (args[0] == "dump") {
      const auto v = tool({"verify", image.string()});
      if (v.exit_code != 0) return fail("an image dump --job called complete does not verify: " + describe(v));
      ++f_.images_checked;
    }
  }

  // The tool with a random fate: left alone (12 in 20), killed within 0.7 s (3), stopped for a while (2), a rank
  // stopped for a while (2), a rank killed (1).
  process_result tool_with_fate(const std::vector<std::string>& args) {
    ++f_.operations;
    std::vector<std::string> argv{cuda_ckpt};
    argv.insert(argv.end(), args.begin(), args.end());
    background_process p(argv, job_->env(), /*stderr_too=*/true);
    const int fate = static_cast<int>(rng_() % 20);
    const pid_t rank = job_->ranks[rng_() % job_->ranks.size()];
    history_ += (history_.empty() ? "" : ", ") + args[0] +
                (fate < 3   ? " (tool killed)"
                 : fate < 5 ? " (tool stopped)"
                 : fate < 7 ? " (rank " + std::to_string(rank) + " stopped)"
                 : fate < 8 ? " (rank " + std::to_string(rank) + " killed)"
                            : "");
    if (fate < 3) {
      usleep(static_cast<useconds_t>(rng_() % 700'000));
      if (p.running() && ::kill(p.pid(), SIGKILL) == 0) ++f_.tool_kills;
    } else if (fate < 5) {
      if (stop_for_a_while(rng_, p.pid())) ++f_.tool_stops;
    } else if (fate < 7) {
      if (stop_for_a_while(rng_, rank)) ++f_.rank_stops;
    } else if (fate < 8) {
      usleep(static_cast<useconds_t>(rng_() % 700'000));
      if (::kill(rank, SIGKILL) == 0) {
        ++f_.rank_kills;
        rank_killed_ = true;
      }
    }
    const bool ended = ends_within(p, 120);
    if (fate >= 5 && fate < 7) ::kill(rank, SIGCONT);  // the user continues it, whatever the tool did
    if (!ended) fail("a tool did not end within 120 s: " + args[0] + "\n" + p.output());
    const auto r = result_of(p);
    history_ += " -> " + std::to_string(p.wait());
    if (r.exit_code == 1 && r.out.find("stopped") != std::string::npos) ++f_.refused_stopped;
    return r;
  }


  // After an operation: every rank running, or every rank suspended; a job whose rank was killed ends whole.
  void settle() {
    if (rank_killed_) {
      if (!job_->all_gone(30)) fail("a rank was killed and the rest of the job did not end: " + states());
      return;
    }
    std::vector<std::string> now;
    const bool settled = wait_until(
        [&] {
          now = rank_states(*job_);
          const bool done = !job_->results().empty();
          return done || std::all_of(now.begin(), now.end(), [](const std::string& s) { return s == "running"; }) ||
                 std::all_of(now.begin(), now.end(), [](const std::string& s) { return s == "suspended"; });
        },
        20);
    if (!job_->results().empty()) return;  // it ran to its end: finish checks its results
    if (settled) {
      suspended_ = now.front() == "suspended";
      return;
    }
    // Some ranks resumed and some not (a resume --job killed or failed midway): resume --job finishes the job's
    // way back.
    const auto r = job_->ckpt({"resume", "--job", job_->id()});
    if (r.exit_code != 0 || !all_in_state(*job_, "running", 20))
      return fail("the job settled neither running nor suspended (" + states() +
                  ") and resume --job did not bring it "
                  "back: " +
                  describe(r));
    suspended_ = false;
  }

  // A suspended job is resumed; the job then runs to its end with the reference results; gc leaves nothing.
  void finish() {
    if (rank_killed_) return;
    if (suspended_) {
      const auto r = job_->ckpt({"resume", "--job", job_->id()});
      if (r.exit_code != 0) return fail("a suspended job does not resume: " + describe(r));
      ++f_.resumed_after;
    }
    const int code = job_->wait_end(120);
    if (code != 0) return fail("the job did not end with exit 0 within 120 s (" + std::to_string(code) + ")");
    if (job_->results() != reference_results(job_ranks, job_steps))
      return fail("the job's results differ from a run without the shim");
    ++f_.jobs_ended_whole;
    const auto gc = tool({"gc", job_->dir.path.string()});
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(job_->dir.path, ec))
      if (entry.path().filename().string().find(".partial-") != std::string::npos)
        fail("left behind: " + entry.path().string() + "\n(gc said: " + gc.out + gc.err + ")");
  }

  std::mt19937_64 rng_;
  job_chaos_figures& f_;
  collective_job* job_ = nullptr;
  bool suspended_ = false;    // every rank suspended after the last operation
  bool rank_killed_ = false;  // the test killed a rank: the job ends
  bool gave_up_ = false;
  std::string history_;  // what was done in the round, for a failure's message
};

}  // namespace

TEST_CASE("chaos, jobs: dump, suspend and resume --job of 3 ranks with tools killed or stopped and ranks stopped or "
          "killed; every job running, resumable or ended whole",
          "[job][chaos]") {
  // VMMCKPT_JOB_CHAOS_SECONDS runs it longer (docs/reliability.md has the figures); VMMCKPT_CHAOS_SEED repeats one.
  const char* seconds_env = std::getenv("VMMCKPT_JOB_CHAOS_SECONDS");
  const char* seed_env = std::getenv("VMMCKPT_CHAOS_SEED");
  const int seconds = seconds_env ? std::atoi(seconds_env) : 30;
  const std::uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 0) : std::random_device{}();
  INFO("seed " << seed);
  job_chaos_figures f;
  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (std::uint64_t round = 0; std::chrono::steady_clock::now() < stop_at && f.failures.empty(); ++round) {
    job_chaos_round(seed + round, f).run();
    ++f.rounds;
  }
  WARN("job chaos: seed " << seed << ", " << seconds << " s, " << f.rounds << " rounds, " << f.operations
                          << " operations (" << f.completed << " completed); kills: " << f.tool_kills << " tools, "
                          << f.rank_kills << " ranks; stops: " << f.tool_stops << " tools, " << f.rank_stops
                          << " ranks (" << f.refused_stopped << " operations refused a stopped rank); "
                          << f.resumed_after << " suspended jobs resumed at the end; " << f.images_checked
                          << " images verified; " << f.jobs_ended_whole << " jobs ended with the reference results; "
                          << f.failures.size() << " failures");
  for (const auto& failure : f.failures) FAIL_CHECK(failure);
  REQUIRE(f.failures.empty());
  REQUIRE(f.rounds > 0);
}

}  // namespace vmmckpt::test
