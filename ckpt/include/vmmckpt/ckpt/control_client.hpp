// The tool's side of the control channel: find a process under the shim and talk to it.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace vmmckpt::ckpt {

// A failure the user can act on; the message says what happened and what to do.
struct tool_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class control_client {
 public:
  // Connects to pid's control socket, checking first that the process exists,
  // is ours, and runs under the shim. Throws tool_error naming the reason.
  explicit control_client(pid_t pid);
  ~control_client();
  control_client(const control_client&) = delete;
  control_client& operator=(const control_client&) = delete;

  // One request and its response. fds receives descriptors that rode along
  // (and those of follow-up "fds" frames when the response says fd_count).
  // A response with ok=false becomes a tool_error with its text.
  nlohmann::json call(const nlohmann::json& request, std::vector<int>* fds = nullptr, int timeout_ms = 30'000);

  pid_t pid() const { return pid_; }
  int fd_for_tests() const { return fd_; }  // fault injection only

 private:
  pid_t pid_;
  int fd_ = -1;
};

struct process_entry {
  pid_t pid = 0;
  nlohmann::json hello;  // the process's answer to hello
};

// Every process of ours that runs under the shim. Sockets left by processes
// that are gone are removed.
std::vector<process_entry> list_processes();

}  // namespace vmmckpt::ckpt
