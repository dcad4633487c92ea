// The tool's side of the control channel: find a process under the shim and send it typed requests.
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

#include "vmmckpt/fault_point.hpp"

namespace vmmckpt::ckpt {
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

[[noreturn]] void channel_failed(pid_t pid, const protocol::failure& f) {
  const std::string who = "process " + std::to_string(pid);
  if (f.kind == protocol::failure_kind::connection_closed)
    throw control_error(who + " went away (it exited or its control server stopped)", f.kind);
  throw control_error(who + ": " + f.text, f.kind);
}

void close_all(std::vector<int>& fds) {
  for (int f : fds) ::close(f);
  fds.clear();
}

// The allocation table's bytes: a memfd of the process, read whole (at most 4 GiB: 170 million allocations).
bool read_table(int fd, std::string& out) {
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) > (4ULL << 30)) return false;
  out.resize(static_cast<std::size_t>(st.st_size));
  for (std::size_t done = 0; done < out.size();) {
    const ssize_t r = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<std::size_t>(r);
  }
  return true;
}

}  // namespace

received_fds::~received_fds() {
  for (int f : fds_)
    if (f >= 0) ::close(f);
}

received_fds& received_fds::operator=(received_fds&& o) noexcept {
  if (this != &o) {
    for (int f : fds_)
      if (f >= 0) ::close(f);
    fds_ = std::move(o.fds_);
    o.fds_.clear();
  }
  return *this;
}

int received_fds::take(std::size_t i) {
  const int f = fds_.at(i);
  fds_[i] = -1;
  return f;
}

control_client::control_client(pid_t pid) : pid_(pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat st{};
  if (pid <= 0 || ::stat(proc.c_str(), &st) != 0)
    throw tool_error("no process " + std::to_string(pid));
  if (st.st_uid != ::geteuid() && ::geteuid() != 0)
    throw tool_error("process " + std::to_string(pid) + " belongs to another user (uid " + std::to_string(st.st_uid) +
                     "); only its owner or root may checkpoint it");
  protocol::failure error;
  const std::string path = st.st_uid == ::geteuid() ? protocol::socket_path(pid) : socket_of_other_user(pid, st.st_uid);
  fd_ = protocol::connect_to(path, error);
  if (fd_ < 0) {
    if (error.kind == protocol::failure_kind::no_socket)
      throw tool_error("process " + std::to_string(pid) +
                       " is not running under vmmckpt (no control socket at " + path +
                       "; start it with `cuda-ckpt run`, and note the socket appears at its first CUDA allocation)");
    throw tool_error("cannot reach process " + std::to_string(pid) + " at " + path + ": " + error.text);
  }
}

control_client::~control_client() {
  if (fd_ >= 0) ::close(fd_);
}

void control_client::send(const control::request& r) {
  protocol::failure error;
  if (!protocol::send_frame(fd_, control::encode(r), {}, error)) channel_failed(pid_, error);
}

std::string control_client::receive(std::vector<int>* fds, int timeout_ms) {
  std::string payload;
  std::vector<int> received;
  protocol::failure error;
  if (!protocol::recv_frame(fd_, payload, received, timeout_ms, error)) channel_failed(pid_, error);
  if (fds != nullptr)
    fds->insert(fds->end(), received.begin(), received.end());
  else
    close_all(received);  // none expected
  return payload;
}

template <typename Reply>
Reply control_client::call(const control::request& r, int timeout_ms, std::vector<int>* fds) {
  send(r);
  // Tests kill the tool here: the request is out, its answer never read.
  std::visit([](const auto& req) {
    using T = std::decay_t<decltype(req)>;
    if constexpr (std::is_same_v<T, control::resume_request>) fault_point("requested:resume");
    if constexpr (std::is_same_v<T, control::suspend_request>) fault_point("requested:suspend");
  }, r);
  std::vector<int> mine;
  const std::string payload = receive(&mine, timeout_ms);
  try {
    auto decoded = control::decode_reply<Reply>(payload);
    if (auto* refused = std::get_if<control::failure_reply>(&decoded)) {
      close_all(mine);
      throw control_error("process " + std::to_string(pid_) + ": " + refused->error, refused->code);
    }
    if (fds != nullptr) *fds = std::move(mine);
    else close_all(mine);
    return std::get<Reply>(std::move(decoded));
  } catch (const control::decode_error& e) {
    close_all(mine);
    throw control_error("process " + std::to_string(pid_) + " sent a malformed reply: " + e.what(),
                        protocol::failure_kind::bad_frame);
  }
}

control::hello_reply control_client::hello(int timeout_ms) {
  return call<control::hello_reply>(control::hello_request{}, timeout_ms);
}

control::dump_begin_reply control_client::dump_begin(int deadline_ms, received_fds& fds, int timeout_ms) {
  std::vector<int> got;
  struct close_on_failure {
    std::vector<int>& fds;
    bool done = false;
    ~close_on_failure() {
      if (!done) close_all(fds);
    }
  } guard{got};
  auto reply = call<control::dump_begin_reply>(control::dump_begin_request{deadline_ms}, timeout_ms, &got);
  // More descriptors than one frame carries follow in fds frames.
  while (got.size() < reply.fd_count) {
    const std::string payload = receive(&got, timeout_ms);
    try {
      control::decode_fds_frame(payload);
    } catch (const control::decode_error& e) {
      throw control_error("process " + std::to_string(pid_) + " sent a malformed fds frame: " + e.what(),
                          protocol::failure_kind::bad_frame);
    }
  }
  if (got.size() != reply.fd_count || got.empty())
    throw control_error("process " + std::to_string(pid_) + " sent " + std::to_string(got.size()) +
                            " descriptors, expected " + std::to_string(reply.fd_count),
                        protocol::failure_kind::bad_frame);
  // The last descriptor is the allocation table; the others are the segments'.
  const int table_fd = got.back();
  got.pop_back();
  std::string table;
  const bool read = read_table(table_fd, table);
  ::close(table_fd);
  try {
    if (!read) throw control::decode_error("cannot read it");
    control::decode_allocation_table(table, reply);
  } catch (const control::decode_error& e) {
    throw control_error("process " + std::to_string(pid_) + " sent a bad allocation table: " + e.what(),
                        protocol::failure_kind::bad_frame);
  }
  guard.done = true;
  fds = received_fds(std::move(got));
  return reply;
}

control::dump_end_reply control_client::dump_end(int timeout_ms) {
  return call<control::dump_end_reply>(control::dump_end_request{}, timeout_ms);
}

control::suspend_reply control_client::suspend(const std::string& image, int timeout_ms) {
  return call<control::suspend_reply>(control::suspend_request{image}, timeout_ms);
}

control::resume_reply control_client::resume(int timeout_ms) {
  return call<control::resume_reply>(control::resume_request{}, timeout_ms);
}

control::check_reply control_client::check(int timeout_ms) {
  return call<control::check_reply>(control::check_request{}, timeout_ms);
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
      out.push_back({pid, client.hello(2'000)});
    } catch (const tool_error&) {
      // Not answering (busy, exiting): leave it out of the list.
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace vmmckpt::ckpt
