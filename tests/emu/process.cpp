// Runs a program for an end-to-end test and captures what it printed and how it ended.
#include "process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace vmmckpt::test {

namespace {

// fork + exec with stdout (and stderr, unless -1) on the given descriptors and
// the environment changed as `env` says (an empty value unsets).
pid_t start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int out_fd,
            int err_fd) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid > 0) return pid;
  dup2(out_fd, 1);
  if (err_fd >= 0) dup2(err_fd, 2);
  // Nothing else of this process's: ctest's own log, open here, would be in a whole-process image, and CRIU
  // refuses to restore a file that changed size since.
  ::close_range(3, ~0U, 0);
  for (const auto& [key, value] : env) {
    if (value.empty())
      unsetenv(key.c_str());
    else
      setenv(key.c_str(), value.c_str(), 1);
  }
  // scripts/sanitize.sh: the ASan runtime must come before an instrumented shim we preload.
  if (const char* first = getenv("VMMCKPT_TEST_PRELOAD_FIRST");
      first && *first && env.count("LD_PRELOAD") && !env.at("LD_PRELOAD").empty())
    setenv("LD_PRELOAD", (std::string(first) + ":" + env.at("LD_PRELOAD")).c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  _exit(127);
}

}  // namespace

process_result run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                           int timeout_s) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = start(argv, env, out_pipe[1], err_pipe[1]);
  close(out_pipe[1]);
  close(err_pipe[1]);

  process_result result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  bool killed = false;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    if (poll(fds, 2, killed ? 1000 : static_cast<int>(left.count())) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

background_process::background_process(const std::vector<std::string>& argv,
                                       const std::map<std::string, std::string>& env, bool stderr_too) {
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_ = start(argv, env, out_pipe[1], stderr_too ? out_pipe[1] : -1);
  close(out_pipe[1]);
  out_fd_ = out_pipe[0];
}

background_process::~background_process() {
  if (status_ < 0 && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

bool background_process::wait_for_output(const std::string& text, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (out_.find(text) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{out_fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n <= 0) return out_.find(text) != std::string::npos;
    out_.append(buf, static_cast<size_t>(n));
  }
  return true;
}

void background_process::drain() {
  for (pollfd pfd{out_fd_, POLLIN, 0}; out_fd_ >= 0 && poll(&pfd, 1, 0) > 0 && (pfd.revents & POLLIN);) {
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n <= 0) return;
    out_.append(buf, static_cast<size_t>(n));
  }
}

bool background_process::running() {
  drain();  // a program blocked on a full pipe would never end
  if (status_ >= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

int background_process::wait() {
  if (status_ < 0) {
    int status = 0;
    waitpid(pid_, &status, 0);
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  drain();
  return status_;
}

}  // namespace vmmckpt::test
