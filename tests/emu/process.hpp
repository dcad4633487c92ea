// Runs a program for an end-to-end test and captures what it printed and how it ended.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace vmmckpt::test {

struct process_result {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string out;
  std::string err;
};

// Runs argv with the current environment plus `env` (an empty value unsets the
// variable). Kills the program after timeout_s.
process_result run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                           int timeout_s = 60);

// A program started in the background; killed (SIGKILL) and reaped on destruction.
class background_process {
 public:
  // `stderr_too`: its stderr joins its stdout in output(); otherwise it goes to this process's stderr.
  background_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                     bool stderr_too = false);
  ~background_process();
  background_process(const background_process&) = delete;
  background_process& operator=(const background_process&) = delete;

  pid_t pid() const { return pid_; }
  // Reads its stdout until `text` has appeared; false on timeout or exit.
  bool wait_for_output(const std::string& text, int timeout_s = 30);
  // What it printed and was read: by wait_for_output, and what running() and wait() found waiting.
  const std::string& output() const { return out_; }
  bool running();
  // Waits for it to end; the exit code, or 128 + signal.
  int wait();

 private:
  void drain();  // reads what is waiting in the pipe, without blocking
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string out_;
  int status_ = -1;
};

}  // namespace vmmckpt::test
