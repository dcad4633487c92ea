// Chaos for whole-process checkpoints (issue 32): rounds of `dump --process` (ending the program, or with
// --leave-running) and `restore DIR` against a ticking program tree, with the tool, CRIU or the program killed,
// or the program or the tool stopped for a while (issue 49), at random moments and images written into a small file system that fills up. After every operation the test
// does only what `cuda-ckpt ps` says (the way back of an interrupted operation), and every round must end with
// the program running, its GPU buffers matching its CPU counter, or restorable from a complete image: zero lost
// (docs/reliability.md, "Chaos, whole process").
#include <sys/mount.h>

#include <algorithm>
#include <atomic>
#include <random>

#include "process_support.hpp"

namespace vmmckpt::test {
namespace {

struct process_chaos_figures {
  int rounds = 0, operations = 0, dumps_complete = 0, restores_complete = 0;
  int tool_kills = 0, criu_kills = 0, program_kills = 0, full_disk_failures = 0;
  int program_stops = 0, tool_stops = 0;          // stopped (SIGSTOP) for a while, then continued
  int refused_stopped = 0;                        // operations that refused the program, stopped, saying so
  int followed_resume = 0, followed_restore = 0;  // ways back ps named, followed
  int restored_after_dump = 0;                    // ended by a complete dump (as asked), brought back from that image
  int restored_after_kill = 0;                    // killed by the test, brought back from its last complete image
  int restored_after_criu_kill = 0;  // ended by CRIU killed while its code was in it, back from its last image
  int ended_without_image = 0;       // killed before any image of it existed: not vmmckpt's to keep
  int images_checked = 0;            // complete images that verify accepted
  std::vector<std::string> failures;
};

// Processes of CRIU working in `dir` (its images or logs are there): the oldest first.
std::vector<pid_t> criu_processes_in(const fs::path& dir) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd;
    try {
      std::ifstream in(entry.path() / "cmdline", std::ios::binary);
      cmd.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } catch (const std::exception&) {
      continue;  // it ended while read
    }
    if (cmd.find("usr/sbin/criu") != std::string::npos && cmd.find(dir.string()) != std::string::npos)
      out.push_back(std::stoi(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

class process_chaos_round {
 public:
  process_chaos_round(std::uint64_t seed, process_chaos_figures& f) : rng_(seed), f_(f) {}

  void run() {
    ticker_tree t(rng_() % 3 == 0 ? std::vector<std::string>{"--children", "1"} : std::vector<std::string>{});
    t_ = &t;
    small_ = t.dir.path / "small";
    fs::create_directory(small_);
    const std::string size = std::to_string(4 + rng_() % 28) + "m";
    mounted_ =
        ::mount("vmmckpt-process-chaos", small_.c_str(), "tmpfs", 0, ("size=" + size + ",mode=0700").c_str()) == 0;
    // A first checkpoint, left alone, as a job checkpointed periodically has: what the program comes back from
    // should CRIU be killed while its code is in it (the one thing the transaction cannot undo).
    dump(0, false);
    settle();
    const int steps = 2 + static_cast<int>(rng_() % 4);
    for (int step = 1; step <= steps && !gave_up_; ++step) {
      if (program_alive())
        dump(step, true);
      else
        restore();
      settle();
    }
    finish();
    if (mounted_) ::umount2(small_.c_str(), MNT_DETACH);
    t_ = nullptr;
  }

 private:
  // The records of this round's program's transactions, for a failure's message.
  std::string records() const {
    std::string out;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/dev/shm/vmmckpt-" + std::to_string(::geteuid()), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("whole-process-", 0) != 0 || name.find("-" + std::to_string(t_->pid) + "-") == std::string::npos)
        continue;
      std::ifstream in(entry.path());
      out += "\n  " + name + ": " + std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    return out.empty() ? " none" : out;
  }

  void fail(const std::string& what) {
    reap();
    std::ifstream in(t_->dir.path / "out");
    const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    f_.failures.push_back("round with program " + std::to_string(t_->pid) + ": " + what +
                          (out.empty() ? "" : "\n(its output: " + out + ")") +
                          (program_end_.empty() ? "" : "\n(the program " + program_end_ + ")") +
                          "\n(operations: " + history_ + ")\n(records:" + records() + ")");
    gave_up_ = true;
  }

  bool program_alive() { return reap(); }
  // A zombie is gone: reaped here (this test is the subreaper of what it starts), the program's end noted.
  bool reap() {
    int status = 0;
    for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;)
      if (p == t_->pid)
        program_end_ = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                           : "exited with " + std::to_string(WEXITSTATUS(status));
    return ::kill(t_->pid, 0) == 0;
  }

  // One tool run with a random fate (with `chaos`): left alone, killed, its CRIU killed, the program killed
  // meanwhile, the program or the tool stopped for a while and continued.
  process_result tool_with_fate(const std::vector<std::string>& args, bool chaos = true) {
    ++f_.operations;
    std::vector<std::string> argv{cuda_ckpt};
    argv.insert(argv.end(), args.begin(), args.end());
    background_process p(argv, {}, /*stderr_too=*/true);  // its messages in a failure's, not in the test's log
    const int fate = chaos ? static_cast<int>(rng_() % 20) : 19;
    const bool pre_copy = std::find(args.begin(), args.end(), "--pre-copy") != args.end();
    history_ += (history_.empty() ? "" : ", ") + args[0] + (pre_copy ? " --pre-copy" : "") +
                (fate < 5    ? " (tool killed)"
                 : fate < 9  ? " (CRIU killed)"
                 : fate < 10 ? " (program killed)"
                 : fate < 13 ? " (program stopped)"
                 : fate < 14 ? " (tool stopped)"
                             : "");
    // A dump or restore of the test's small tree takes about half a second: the kills fall within it.
    if (fate < 5) {  // the tool, at any moment
      usleep(static_cast<useconds_t>(rng_() % 700'000));
      if (p.running()) {
        ::kill(p.pid(), SIGKILL);
        ++f_.tool_kills;
      }
    } else if (fate < 9) {  // CRIU, once it runs
      std::vector<pid_t> criu;
      for (int i = 0; i < 500 && p.running() && (criu = criu_processes_in(t_->dir.path)).empty(); ++i) usleep(10'000);
      if (!criu.empty()) {
        usleep(static_cast<useconds_t>(rng_() % 400'000));
        if (::kill(criu.front(), SIGKILL) == 0) {
          ++f_.criu_kills;
          criu_killed_ = true;
        }
      }
    } else if (fate < 10) {  // the program (its whole tree), at any moment
      usleep(static_cast<useconds_t>(rng_() % 700'000));
      if (::kill(t_->pid, SIGKILL) == 0) {
        (void)!::system(("pkill -9 -f " + t_->log.string() + " >/dev/null 2>&1").c_str());
        ++f_.program_kills;
        killed_by_test_ = true;
      }
    } else if (fate < 13) {  // the program, as a user's Ctrl-Z or a scheduler's suspend: continued later
      if (stop_for_a_while(rng_, t_->pid)) ++f_.program_stops;
    } else if (fate < 14) {  // the tool
      if (stop_for_a_while(rng_, p.pid())) ++f_.tool_stops;
    }
    const bool ended = ends_within(p, 120);
    // Whatever the tool did with a stopped program, the user's continuing it lets it go on (checked by settle).
    if (fate >= 10 && fate < 13) ::kill(t_->pid, SIGCONT);
    if (!ended) fail("a tool did not end within 120 s: " + args[0] + "\n" + p.output());
    const auto r = result_of(p);
    history_ += ended ? " -> " + std::to_string(p.wait()) : "";
    if (r.exit_code == 1 && r.out.find("is stopped by a signal") != std::string::npos) ++f_.refused_stopped;
    return r;
  }


  void dump(int step, bool chaos) {
    const bool into_small = chaos && mounted_ && rng_() % 3 == 0;
    const fs::path image = (into_small ? small_ : t_->dir.path) / ("image-" + std::to_string(step));
    const bool leave_running = !chaos || rng_() % 2 == 0;
    std::vector<std::string> args{"dump", std::to_string(t_->pid), "--process", "-o", image.string()};
    if (leave_running) args.push_back("--leave-running");
    if (chaos && rng_() % 3 == 0) args.push_back("--pre-copy");  // a dump while it runs, then the stop
    const auto r = tool_with_fate(args, chaos);
    if (!chaos && r.exit_code != 0) return fail("the first dump, left alone, failed: " + describe(r));
    if (r.exit_code == 0) {
      ++f_.dumps_complete;
      complete_.push_back(image);
      ended_by_dump_ = !leave_running;
    } else if (r.exit_code == 1 && into_small) {
      ++f_.full_disk_failures;
    }
  }

  void restore() {
    if (complete_.empty()) return;
    const auto r = tool_with_fate({"restore", complete_.back().string()});
    if (r.exit_code == 0) ++f_.restores_complete;
  }

  // CRIU left running by a killed tool ends by itself: ps says nothing of its transaction until then.
  void wait_for_criu() {
    for (int i = 0; i < 600 && !criu_processes_in(t_->dir.path).empty(); ++i) usleep(100'000);
    const auto left = criu_processes_in(t_->dir.path);
    if (left.empty()) return;
    std::string what;
    for (pid_t p : left) {
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat"), cmd("/proc/" + std::to_string(p) + "/cmdline"),
          wchan("/proc/" + std::to_string(p) + "/wchan");
      std::string line, c, w;
      std::getline(stat, line);
      std::getline(cmd, c);
      std::getline(wchan, w);
      std::replace(c.begin(), c.end(), '\0', ' ');
      what += "\n  " + line.substr(0, 60) + " wchan " + w + ": " + c;
      std::ifstream status("/proc/" + std::to_string(p) + "/status");
      for (std::string l; std::getline(status, l);)
        if (l.rfind("Sig", 0) == 0 || l.rfind("Shd", 0) == 0 || l.rfind("TracerPid", 0) == 0) what += "\n    " + l;
      const auto at = c.find("--log-file ");
      if (at != std::string::npos) {
        std::ifstream log(c.substr(at + 11, c.find(' ', at + 11) - at - 11));
        const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
        what += "\n  its log: " + text.substr(text.size() > 2000 ? text.size() - 2000 : 0);
      }
      ::kill(p, SIGKILL);
    }
    std::ifstream pstat("/proc/" + std::to_string(t_->pid) + "/stat");
    std::string program;
    std::getline(pstat, program);
    fail("CRIU did not end within 60 s:" + what + "\n  the program: " + program.substr(0, 60));
  }

  // What ps says of this round's program: its interrupted operation, and its own entry.
  void ask_ps(nlohmann::json& interrupted, nlohmann::json& process) {
    interrupted = nullptr;
    process = nullptr;
    const auto r = tool({"ps", "--json"});
    if (r.exit_code != 0) return fail("ps failed: " + describe(r));
    for (const auto& e : nlohmann::json::parse(r.out)) {
      if (e.value("pid", 0) != t_->pid) continue;
      if (e.value("status", "") == "interrupted")
        interrupted = e;
      else if (e.value("status", "") != "orphaned")
        process = e;
    }
  }

  // What is left of the program's tree once its root is gone (a child CRIU's kill of the root left running):
  // ended, as a user ends it before a restore (which refuses while the pids are taken, saying so).
  void end_what_is_left() {
    (void)!::system(("pkill -9 -f " + t_->log.string() + " >/dev/null 2>&1").c_str());
    for (int i = 0; i < 50 && ::system(("pgrep -f " + t_->log.string() + " >/dev/null 2>&1").c_str()) == 0; ++i) {
      reap();
      usleep(100'000);
    }
    reap();
  }

  // Follows what ps names, until the program runs or nothing more can bring it back. A program that ps finds
  // not running, with no way back named, is asked about again for a while: on a loaded machine it may answer
  // ps late, and a killed tool's CRIU may not have started yet (the transaction is under way until it ends).
  void settle() {
    wait_for_criu();
    int patience = 10;
    for (int attempt = 0; attempt < 4 && !gave_up_; ++attempt) {
      nlohmann::json interrupted, process;
      ask_ps(interrupted, process);
      if (interrupted.is_object()) {
        reap();  // what ended: a zombie keeps its pid, which a restore needs
        const std::string outcome = interrupted.value("outcome", "");
        if (outcome == "ended") {
          // Nothing of that operation brings it back: explained only by the test's own kills, and then its last
          // complete image does (below, once ps has nothing more to say).
          if (!killed_by_test_ && !criu_killed_) return fail("LOST: ps says it ended: " + interrupted.dump());
          tool({"gc"});
          continue;
        }
        std::istringstream commands(interrupted.value("way_back", ""));
        for (std::string command; std::getline(commands, command, ';');) {
          std::istringstream words(command);
          std::vector<std::string> args;
          for (std::string w; words >> w;)
            if (w != "cuda-ckpt") args.push_back(w);
          const auto r = tool(args);
          if (r.exit_code != 0) {
            std::ifstream stat("/proc/" + std::to_string(t_->pid) + "/stat");
            std::string line;
            std::getline(stat, line);
            return fail("the way back ps named failed: " + command + "\n" + describe(r) +
                        "\nps said: " + interrupted.dump() + "\nthe pid: " + line.substr(0, 300));
          }
        }
        ++(outcome == "resume" ? f_.followed_resume : f_.followed_restore);
        if (outcome == "restore") complete_.push_back(interrupted.value("image", ""));
        continue;
      }
      if (program_alive()) {
        ended_by_dump_ = killed_by_test_ = criu_killed_ = false;
        if (process.is_object() && process.value("state", "") != "running") {
          if (patience-- > 0) {
            --attempt;
            ::sleep(1);
            wait_for_criu();
            continue;
          }
          return fail("the program is " + process.value("state", "?") + " and ps names no way back: " + process.dump());
        }
        if (!t_->goes_on({t_->log}, 3)) return fail("the program does not go on, and ps names no way back");
        if (const auto problem = tick_problem(t_->log); !problem.empty()) return fail(problem);
        return;
      }
      // Gone, and no operation of ours was interrupted: a complete dump ended it (as asked), the test killed it,
      // or CRIU was killed while its code was in it. Anything else is a program lost.
      const bool explained = ended_by_dump_ || killed_by_test_ || criu_killed_;
      if (!explained) return fail("LOST: the program is gone, and ps names no way back");
      if (complete_.empty() || !fs::exists(complete_.back() / "process.json")) {
        if (ended_by_dump_) return fail("LOST: a dump said it was complete and its image is gone");
        ++f_.ended_without_image;
        gave_up_ = true;
        return;
      }
      end_what_is_left();
      const auto r = tool({"restore", complete_.back().string()});
      if (r.exit_code != 0) return fail("its last complete image does not restore: " + describe(r));
      ++(ended_by_dump_    ? f_.restored_after_dump
         : killed_by_test_ ? f_.restored_after_kill
                           : f_.restored_after_criu_kill);
      ended_by_dump_ = killed_by_test_ = criu_killed_ = false;
    }
  }

  // The end of a round: every complete image verifies; ps names nothing; gc leaves no unfinished image.
  void finish() {
    for (const auto& image : complete_) {
      if (!fs::exists(image / "process.json")) continue;
      const auto v = tool({"verify", image.string()});
      if (v.exit_code != 0 && !killed_by_test_)
        f_.failures.push_back(image.string() + " was complete and does not verify: " + describe(v));
      else if (v.exit_code == 0)
        ++f_.images_checked;
    }
    ::kill(t_->pid, SIGKILL);
    (void)!::system(("pkill -9 -f " + t_->log.string() + " >/dev/null 2>&1").c_str());
    wait_gone(t_->pid, 10);
    wait_for_criu();
    const auto gc = tool({"gc", t_->dir.path.string(), small_.string()});
    for (const fs::path& where : {t_->dir.path, small_}) {
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(where, ec))
        if (entry.path().filename().string().find(".partial-") != std::string::npos)
          f_.failures.push_back("left behind: " + entry.path().string() + "\n(gc said: " + gc.out + gc.err +
                                ")\n(operations: " + history_ + ")");
    }
    tool({"gc"});  // the records of this round's transactions
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/dev/shm/vmmckpt-" + std::to_string(::geteuid()), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("whole-process-", 0) == 0 && name.find("-" + std::to_string(t_->pid) + "-") != std::string::npos)
        f_.failures.push_back("left behind: the record " + entry.path().string());
    }
  }

  std::mt19937_64 rng_;
  process_chaos_figures& f_;
  ticker_tree* t_ = nullptr;
  fs::path small_;
  bool mounted_ = false;
  bool killed_by_test_ = false;  // the test killed the program (not CRIU or the tool)
  bool criu_killed_ = false;     // the test killed CRIU
  bool ended_by_dump_ = false;   // a complete dump without --leave-running ended the program
  bool gave_up_ = false;
  std::vector<fs::path> complete_;  // images dumps said were complete, oldest first
  std::string program_end_;         // how the program's last incarnation ended, when reaped here
  std::string history_;             // what was done in the round, for a failure's message
};

}  // namespace

TEST_CASE("chaos, whole process: dumps and restores with the tool, CRIU or the program killed or stopped, disks full; "
          "every program running or restorable, ps naming the way back",
          "[process][chaos]") {
  REQUIRE_CRIU();
  // VMMCKPT_PROCESS_CHAOS_SECONDS runs it longer (docs/reliability.md has the figures of a 30-minute run);
  // VMMCKPT_CHAOS_SEED repeats one.
  const char* seconds_env = std::getenv("VMMCKPT_PROCESS_CHAOS_SECONDS");
  const char* seed_env = std::getenv("VMMCKPT_CHAOS_SEED");
  const int seconds = seconds_env ? std::atoi(seconds_env) : 30;
  const std::uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 0) : std::random_device{}();
  INFO("seed " << seed);
  process_chaos_figures f;
  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (std::uint64_t round = 0; std::chrono::steady_clock::now() < stop_at; ++round) {
    process_chaos_round(seed + round, f).run();
    ++f.rounds;
  }
  WARN("process chaos: seed " << seed << ", " << seconds << " s, " << f.rounds << " rounds, " << f.operations
                              << " operations (" << f.dumps_complete << " dumps and " << f.restores_complete
                              << " restores complete); kills: " << f.tool_kills << " tools, " << f.criu_kills
                              << " CRIUs, " << f.program_kills << " programs; stops: " << f.program_stops
                              << " programs, " << f.tool_stops << " tools (" << f.refused_stopped
                              << " operations refused the stopped program); " << f.full_disk_failures
                              << " dumps into a full file system; ways back followed: " << f.followed_resume
                              << " resume, " << f.followed_restore << " restore; brought back from their last "
                              << "image: " << f.restored_after_dump << " ended by a complete dump, "
                              << f.restored_after_kill << " killed by the test, " << f.restored_after_criu_kill
                              << " ended by a killed CRIU; " << f.ended_without_image << " ended before any image; "
                              << f.images_checked << " complete images verified; " << f.failures.size() << " failures");
  for (const auto& failure : f.failures) FAIL_CHECK(failure);
  REQUIRE(f.failures.empty());
  REQUIRE(f.rounds > 0);
}

}  // namespace vmmckpt::test
