// The collective job (tests/programs/emu/collective_job.cpp) under the shim, for the job tests and the job chaos
// test: started detached as a scheduler starts one, its ranks found, its end checked against a run without the
// shim.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "collective_job_output.hpp"
#include "process_support.hpp"

namespace vmmckpt::test {

// The job run without the shim and without any checkpoint: the results every other run of it must end with.
// Computed once per (ranks, steps) in this process (a GENERATE'd test case asks for it on every pass).
inline const std::map<int, std::string>& reference_results(int nranks, int steps) {
  static std::map<std::pair<int, int>, std::map<int, std::string>> cache;
  const auto key = std::make_pair(nranks, steps);
  if (const auto found = cache.find(key); found != cache.end()) return found->second;
  scratch_dir dir;
  const auto plain = run_process(
      {job_program, (dir.path / "plain").string(), std::to_string(nranks), std::to_string(steps), "--step-ms", "0"},
      {{"LD_PRELOAD", ""}}, 120);
  INFO(describe(plain));
  REQUIRE(plain.exit_code == 0);
  auto done = done_lines(plain.out);
  REQUIRE(done.size() == static_cast<std::size_t>(nranks));
  return cache[key] = std::move(done);
}
// What /proc/PID/cmdline says, its words joined by spaces; empty for a process gone (or a zombie).
inline std::string command_line(pid_t pid) {
  std::string text = file_text("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

// The collective job, started detached under the shim (as a job a scheduler runs: its output in a file, which CRIU
// takes along), with its ranks on `devices` emulated devices; every cuda-ckpt call gets the same device count.
// This process is the subreaper of what it starts: the launcher, once its starting shell is gone, is its child
// (its exit status can be read), and so is a job CRIU restores.
struct collective_job {
  static constexpr int unknown_exit = -2;  // ended, but not as this process's child

  scratch_dir dir;
  int nranks, devices, steps;
  fs::path work = dir.path / "job";  // the job's DIR: its uid, and each rank's RANK.step
  fs::path out = dir.path / "out";   // the launcher's and the ranks' stdout and stderr
  pid_t pid = 0;                     // the launcher
  std::vector<pid_t> ranks;          // by rank
  int exit_code = -1;

  collective_job(int nranks_, int devices_, int steps_, int step_ms, bool count_gpus = false)
      : nranks(nranks_), devices(devices_), steps(steps_) {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    const std::string command = "setsid " + cuda_ckpt + " run -- " + job_program + " " + work.string() + " " +
                                std::to_string(nranks) + " " + std::to_string(steps) + " --step-ms " +
                                std::to_string(step_ms) + (count_gpus ? " --count-gpus" : "") + " >" + out.string() +
                                " 2>&1 </dev/null & echo $!";
    const auto started = run_process({"/bin/sh", "-c", command}, env());
    REQUIRE(started.exit_code == 0);
    pid = std::stoi(started.out);
    // The launcher names each rank's pid at once; then every rank makes its communicators and runs 10 steps.
    const bool running = wait_until(
        [&] {
          const std::string text = output();
          for (int r = 0; r < nranks; ++r)
            if (text.find("ready " + std::to_string(r) + "\n") == std::string::npos ||
                text.find("step " + std::to_string(r) + " 10\n") == std::string::npos)
              return false;
          return true;
        },
        60);
    INFO("launcher " << pid << (::kill(pid, 0) == 0 ? ", alive" : ", gone") << "; its output:\n" << output());
    REQUIRE(running);
    for (int r = 0; r < nranks; ++r) {
      const std::string marker = "\nrank " + std::to_string(r) + " ";
      const std::string text = "\n" + output();
      const auto at = text.find(marker);
      REQUIRE(at != std::string::npos);
      ranks.push_back(static_cast<pid_t>(std::stol(text.substr(at + marker.size()))));
    }
    REQUIRE(done_lines(output()).empty());  // still running: the test acts on a live job
  }

  ~collective_job() {
    // Only processes of this job (they name its DIR on their command lines): a pid of one gone may be reused.
    std::vector<pid_t> all{pid};
    all.insert(all.end(), ranks.begin(), ranks.end());
    for (const pid_t p : all)
      if (command_line(p).find(work.string()) != std::string::npos) ::kill(p, SIGKILL);
    for (const pid_t p : all) wait_gone(p, 5);
    // A default suspend image of this job (named by its launcher) that a failed test left.
    std::error_code ec;
    const fs::path shm = "/dev/shm/vmmckpt-" + std::to_string(::geteuid());
    for (const auto& entry : fs::directory_iterator(shm, ec))
      if (entry.path().filename().string().rfind("job-" + std::to_string(pid) + "-", 0) == 0)
        fs::remove_all(entry.path(), ec);
  }

  collective_job(const collective_job&) = delete;
  collective_job& operator=(const collective_job&) = delete;

  // The job's device count, unless `extra` names another.
  std::map<std::string, std::string> env(std::map<std::string, std::string> extra = {}) const {
    extra.emplace("VMMCKPT_EMU_DEVICES", std::to_string(devices));
    return extra;
  }

  // cuda-ckpt ARGS with the job's device count (and `extra` in its environment).
  process_result ckpt(const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& extra = {}) const {
    return tool(args, env(extra));
  }

  std::string id() const { return std::to_string(pid); }
  std::string output() const { return file_text(out); }
  std::map<int, std::string> results() const { return done_lines(output()); }

  // The last step each rank finished (its DIR/RANK.step).
  std::vector<int> steps_done() const {
    std::vector<int> done;
    for (int r = 0; r < nranks; ++r) {
      int step = -1;
      std::ifstream(work / (std::to_string(r) + ".step")) >> step;
      done.push_back(step);
    }
    return done;
  }

  // Every rank finishes more steps within `seconds`.
  bool goes_on(int seconds = 15) const {
    const auto at = steps_done();
    return wait_until(
        [&] {
          const auto now = steps_done();
          for (int r = 0; r < nranks; ++r)
            if (now[r] <= at[r]) return false;
          return true;
        },
        seconds);
  }

  // Waits for the launcher to end, at most `seconds`: its exit code (128 + signal when killed), unknown_exit when
  // it ended but is not this process's child, or -1 when it is still running.
  int wait_end(int seconds) {
    if (exit_code != -1) return exit_code;
    const bool ended = wait_until(
        [&] {
          for (const pid_t r : ranks) ::waitpid(r, nullptr, WNOHANG);  // ranks whose launcher went first
          int status = 0;
          const pid_t got = ::waitpid(pid, &status, WNOHANG);
          if (got == pid) {
            exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            return true;
          }
          if (got < 0 && ::kill(pid, 0) != 0) {
            exit_code = unknown_exit;
            return true;
          }
          return false;
        },
        seconds);
    return ended ? exit_code : -1;
  }

  // The job runs to its end, exit 0, with the results of a run without the shim.
  void ends_with_reference_results(int seconds = 90) {
    const int code = wait_end(seconds);
    INFO("launcher " << pid << "; its output:\n" << output());
    REQUIRE(code != -1);
    CHECK(code == 0);
    CHECK(results() == reference_results(nranks, steps));  // run once the job is over: it takes both cores
  }

  // Every process of the job is gone (reaped, where it was this process's child): CRIU can give their pids back.
  bool all_gone(int seconds = 15) {
    if (!wait_gone(pid, seconds)) return false;
    for (const pid_t r : ranks)
      if (!wait_gone(r, seconds)) return false;
    return true;
  }
};

// Each rank's state in `cuda-ckpt ps --json`, by rank ("gone" when it is not listed).
inline std::vector<std::string> rank_states(const collective_job& job) {
  std::vector<std::string> states;
  for (const pid_t p : job.ranks) {
    const auto entry = listed_state(p);
    states.push_back(entry.is_null() ? "gone" : entry.value("state", "?"));
  }
  return states;
}

inline bool all_in_state(const collective_job& job, const std::string& state, int seconds = 10) {
  return wait_until(
      [&] {
        const auto states = rank_states(job);
        return std::all_of(states.begin(), states.end(), [&](const std::string& s) { return s == state; });
      },
      seconds);
}

}  // namespace vmmckpt::test
