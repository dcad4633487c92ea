// What the whole-process tests share: CRIU for the tests, emu_ticker trees under the shim, their tick logs, the tool.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "e2e_support.hpp"
#include "process.hpp"

namespace vmmckpt::test {

inline const std::string ticker = programs + "emu_ticker";

// CRIU 4 for these tests: $VMMCKPT_CRIU, else the one scripts/provision-criu.sh put in .deps/.
inline std::string criu_for_tests() {
  if (const char* c = std::getenv("VMMCKPT_CRIU"); c != nullptr && *c != '\0') return c;
  const std::string provisioned = std::string(VMMCKPT_SOURCE_DIR) + "/.deps/criu/bin/criu";
  return ::access(provisioned.c_str(), X_OK) == 0 ? provisioned : "";
}

// Why the whole-process tests cannot run here, or "" (then VMMCKPT_CRIU names the CRIU they use).
inline std::string criu_skip_reason() {
  if (::geteuid() != 0) return "CRIU dumps and restores processes as root only";
  const std::string criu = criu_for_tests();
  if (criu.empty()) return "no CRIU 4: run scripts/provision-criu.sh, or set VMMCKPT_CRIU";
  ::setenv("VMMCKPT_CRIU", criu.c_str(), 1);
  // Processes CRIU restores detached, and the tickers started detached, are reparented to this
  // process when their parent goes (not to an init that may never reap them): reaped by wait_gone.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  return {};
}

// In a test case's own body: skips it (VMMCKPT_SKIP returns from the test case) when CRIU cannot run.
#define REQUIRE_CRIU()                                                               \
  do {                                                                               \
    if (const std::string why = criu_skip_reason(); !why.empty()) VMMCKPT_SKIP(why); \
  } while (0)

inline std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

inline std::uint64_t last_tick(const fs::path& log) {
  std::uint64_t last = 0;
  for (const auto& line : lines_of(log))
    if (line.rfind("tick ", 0) == 0) last = std::stoull(line.substr(5));
  return last;
}

inline bool wait_until(const std::function<bool()>& done, int seconds = 30) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The process is gone; every process reparented to this subreaper that ended meanwhile is reaped (a
// zombie keeps its pid taken, and CRIU needs the pids back).
inline bool wait_gone(pid_t pid, int seconds = 15) {
  return wait_until(
      [&] {
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
        return ::kill(pid, 0) != 0;
      },
      seconds);
}

// The log's ticks: what is wrong with them, or "". Ticks go up by one; after a restore they start again
// from the tick after the dump (at or below the last one before), never past a gap; no BAD line.
inline std::string tick_problem(const fs::path& log) {
  std::uint64_t previous = 0;
  for (const auto& line : lines_of(log)) {
    if (line.rfind("BAD", 0) == 0) return log.string() + ": " + line;
    if (line.rfind("tick ", 0) != 0) continue;
    const std::uint64_t t = std::stoull(line.substr(5));
    if (t > previous + 1) return log.string() + ": tick " + std::to_string(t) + " after " + std::to_string(previous);
    previous = t;
  }
  return {};
}

// emu_ticker under the shim, detached from this test's pipes (CRIU takes its stdout, a file, along).
struct ticker_tree {
  scratch_dir dir;
  fs::path log = dir.path / "log";
  pid_t pid = 0;

  explicit ticker_tree(const std::vector<std::string>& extra = {}) {
    std::string words;
    for (const auto& w : extra) words += " " + w;
    const auto r = run_process({"/bin/sh", "-c",
                                "setsid " + cuda_ckpt + " run -- " + ticker + " " + log.string() + words + " >" +
                                    (dir.path / "out").string() + " 2>&1 </dev/null & echo $!"});
    REQUIRE(r.exit_code == 0);
    pid = std::stoi(r.out);
    if (!wait_until([&] { return last_tick(log) >= 3; }, 60)) {
      std::string out;
      for (const auto& line : lines_of(dir.path / "out")) out += line + "\n";
      FAIL("the ticker (process " << pid << (::kill(pid, 0) == 0 ? ", alive" : ", gone")
                                  << ") did not tick 3 times in 60 s; " << last_tick(log) << " ticks; its output:\n"
                                  << out);
    }
  }
  ~ticker_tree() {
    // The root and its children (each names its log, under this scratch directory, on its command line).
    ::kill(pid, SIGKILL);
    (void)!::system(("pkill -9 -f " + log.string() + " >/dev/null 2>&1").c_str());
    wait_gone(pid, 5);
  }
  // Has every ticker of the tree log `ticks` more ticks than it has now.
  bool goes_on(const std::vector<fs::path>& logs, std::uint64_t ticks = 5) {
    std::vector<std::uint64_t> at;
    for (const auto& l : logs) at.push_back(last_tick(l));
    return wait_until([&] {
      for (std::size_t i = 0; i < logs.size(); ++i)
        if (last_tick(logs[i]) < at[i] + ticks) return false;
      return true;
    });
  }
  void stop(const std::vector<fs::path>& logs) {
    for (const auto& l : logs) std::ofstream(l.string() + ".stop").put('\n');
    for (const auto& l : logs)
      REQUIRE(wait_until([&] {
        for (const auto& line : lines_of(l))
          if (line.rfind("stopped at", 0) == 0) return true;
        return false;
      }));
  }
};

inline process_result tool(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv{cuda_ckpt};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, env, 120);
}

// The process's state letter in /proc/PID/stat ('T' stopped), or 0 when it is gone.
inline char proc_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat(std::istreambuf_iterator<char>(in), {});
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

// cuda-ckpt ARGS in the background, its stdout and stderr read together, with `victim` stopped (SIGSTOP): before
// the tool starts (`at` empty), or at the moment the tool reaches the fault point `at` (it stops itself there,
// VMMCKPT_TEST_FAULT AT=stop, and is continued once the victim is stopped). No timing: the tool waits stopped.
inline std::unique_ptr<background_process> tool_with_stop(const std::vector<std::string>& args, pid_t victim,
                                                          const std::string& at,
                                                          std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv{cuda_ckpt};
  argv.insert(argv.end(), args.begin(), args.end());
  if (at.empty()) REQUIRE(::kill(victim, SIGSTOP) == 0);
  if (!at.empty()) env["VMMCKPT_TEST_FAULT"] = at + "=stop";
  auto tool = std::make_unique<background_process>(argv, env, /*stderr_too=*/true);
  if (!at.empty()) {
    const bool there = wait_until([&] { return proc_state(tool->pid()) == 'T'; }, 60);
    INFO(tool->output());
    REQUIRE(there);
    REQUIRE(::kill(victim, SIGSTOP) == 0);
    REQUIRE(wait_until([&] { return proc_state(victim) == 'T'; }));
    ::kill(tool->pid(), SIGCONT);
  }
  return tool;
}

// Stops pid (SIGSTOP) at a random moment within 0.7 s, as a user's Ctrl-Z or a scheduler's suspend would, for 0.2
// to 3.2 s, then continues it; false when it was gone. The chaos tests' stop.
inline bool stop_for_a_while(std::mt19937_64& rng, pid_t pid) {
  usleep(static_cast<useconds_t>(rng() % 700'000));
  if (::kill(pid, SIGSTOP) != 0) return false;
  usleep(static_cast<useconds_t>(200'000 + rng() % 3'000'000));
  ::kill(pid, SIGCONT);
  return true;
}

inline bool nothing_named(const fs::path& image) {
  for (const auto& entry : fs::directory_iterator(image.parent_path()))
    if (entry.path().filename().string().rfind(image.filename().string(), 0) == 0 &&
        entry.path().filename().string().find(".partial-") == std::string::npos)
      return false;
  return true;
}

}  // namespace vmmckpt::test
