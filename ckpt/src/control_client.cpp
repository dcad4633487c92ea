// The tool's side of the control channel: find a process under the shim and talk to it.
#include "vmmckpt/ckpt/control_client.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "vmmckpt/protocol.hpp"

namespace vmmckpt::ckpt {

using json = nlohmann::json;

namespace {

// Root checkpointing another user's process: the socket is in that user's
// runtime directory, found from the process's own environment.
std::string socket_of_other_user(pid_t pid, uid_t uid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry, runtime;
  while (std::getline(in, entry, '\0'))
    if (entry.rfind("XDG_RUNTIME_DIR=", 0) == 0) runtime = entry.substr(16);
  const std::string dir = runtime.empty() ? "/tmp/vmmckpt-" + std::to_string(uid) : runtime + "/vmmckpt";
  return dir + "/" + std::to_string(pid) + ".sock";
}

std::string describe_failure(pid_t pid, const std::string& why) {
  if (why.rfind("connection closed", 0) == 0)
    return "process " + std::to_string(pid) + " went away (it exited or its control server stopped)";
  return "process " + std::to_string(pid) + ": " + why;
}

}  // namespace

control_client::control_client(pid_t pid) : pid_(pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat st{};
  if (pid <= 0 || ::stat(proc.c_str(), &st) != 0)
    throw tool_error("no process " + std::to_string(pid));
  if (st.st_uid != ::geteuid() && ::geteuid() != 0)
    throw tool_error("process " + std::to_string(pid) + " belongs to another user (uid " + std::to_string(st.st_uid) +
                     "); only its owner or root may checkpoint it");
  std::string error;
  const std::string path = st.st_uid == ::geteuid() ? protocol::socket_path(pid) : socket_of_other_user(pid, st.st_uid);
  fd_ = protocol::connect_to(path, error);
  if (fd_ < 0) {
    if (::access(path.c_str(), F_OK) != 0)
      throw tool_error("process " + std::to_string(pid) +
                       " is not running under vmmckpt (no control socket at " + path +
                       "; start it with `cuda-ckpt run`, and note the socket appears at its first CUDA allocation)");
    throw tool_error("cannot reach process " + std::to_string(pid) + " at " + path + ": " + error);
  }
}

control_client::~control_client() {
  if (fd_ >= 0) ::close(fd_);
}

json control_client::call(const json& request, std::vector<int>* fds, int timeout_ms) {
  std::string error;
  if (!protocol::send_frame(fd_, request.dump(), {}, error)) throw tool_error(describe_failure(pid_, error));
  std::string payload;
  std::vector<int> received;
  auto fail_closed = [&](const std::string& why) {
    for (int f : received) ::close(f);
    throw tool_error(describe_failure(pid_, why));
  };
  if (!protocol::recv_frame(fd_, payload, received, timeout_ms, error)) fail_closed(error);
  json response = json::parse(payload, nullptr, false);
  if (!response.is_object()) fail_closed("malformed response");
  if (!response.value("ok", false)) {
    for (int f : received) ::close(f);
    throw tool_error("process " + std::to_string(pid_) + ": " + response.value("error", std::string("request refused")));
  }
  const std::size_t expected = response.value("fd_count", static_cast<std::size_t>(received.size()));
  while (received.size() < expected) {
    std::vector<int> more;
    if (!protocol::recv_frame(fd_, payload, more, timeout_ms, error)) {
      received.insert(received.end(), more.begin(), more.end());
      fail_closed(error);
    }
    received.insert(received.end(), more.begin(), more.end());
  }
  if (received.size() != expected) fail_closed("expected " + std::to_string(expected) + " descriptors");
  if (fds != nullptr) *fds = std::move(received);
  else
    for (int f : received) ::close(f);
  return response;
}

std::vector<process_entry> list_processes() {
  std::vector<process_entry> out;
  std::error_code ec;
  const std::filesystem::path dir = protocol::runtime_dir();
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 6 || name.substr(name.size() - 5) != ".sock") continue;
    const pid_t pid = static_cast<pid_t>(std::strtol(name.c_str(), nullptr, 10));
    if (pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      std::filesystem::remove(entry.path(), ec);  // left behind by a process that is gone
      continue;
    }
    try {
      control_client client(pid);
      out.push_back({pid, client.call({{"op", "hello"}}, nullptr, 2'000)});
    } catch (const tool_error&) {
      // Not answering (busy, exiting): leave it out of the list.
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace vmmckpt::ckpt
