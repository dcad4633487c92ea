// The tool's side of the control channel: find a process under the shim and send it typed requests.
#include "vmmckpt/ckpt/control_client.hpp"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <iterator>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::ckpt {
namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text;
}


// The allocation table's bytes: a memfd of the process (sealed: it cannot change or shrink under the
// mapping), mapped read-only (at most 4 GiB: 170 million allocations). Unmapped by the destructor.
struct mapped_table {
  const char* data = nullptr;
  std::size_t size = 0;
  bool ok = false;
  explicit mapped_table(int fd) {
    // Unsealed, the file could shrink under the mapping, and reading it would fault.
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) return;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) > (4ULL << 30)) return;
    size = static_cast<std::size_t>(st.st_size);
    ok = true;
    if (size == 0) return;
    void* at = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (at == MAP_FAILED) {
      ok = false;
      size = 0;
      return;
    }
    data = static_cast<const char*>(at);
  }
  ~mapped_table() {
    if (data != nullptr) ::munmap(const_cast<char*>(data), size);
  }
  mapped_table(const mapped_table&) = delete;
  mapped_table& operator=(const mapped_table&) = delete;
};

// The pools' allocations from the table the process sent (dump_begin's, regions'); the descriptor is closed.
void read_allocation_table(pid_t pid, int table_fd, std::vector<control::pool_contents>& pools) {
  const mapped_table table(table_fd);
  ::close(table_fd);
  try {
    if (!table.ok) throw control::decode_error("cannot read it (not a sealed file)");
    control::decode_allocation_table(std::string_view(table.data, table.size), pools);
  } catch (const control::decode_error& e) {
    throw control_error("process " + std::to_string(pid) + " sent a bad allocation table: " + e.what(),
                        protocol::failure_kind::bad_frame);
  }
}

}  // namespace

std::string why_silent(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string status = read_small_file(proc + "/status");
  if (const auto at = status.find("\nState:\t"); at != std::string::npos) {
    const char state = status[at + 8];
    if (state == 'T')
      return "it is stopped (SIGSTOP, Ctrl-Z or a job scheduler's suspend): `kill -CONT " + std::to_string(pid) +
             "` lets it go on";
    if (state == 't') return "it is stopped by a debugger";
  }
  // cgroup v2: the process's cgroup says whether it is frozen.
  const std::string cgroup = read_small_file(proc + "/cgroup");
  if (cgroup.rfind("0::", 0) == 0) {
    std::string path = cgroup.substr(3);
    while (!path.empty() && (path.back() == '\n' || path.back() == '/')) path.pop_back();
    if (read_small_file("/sys/fs/cgroup" + path + "/cgroup.events").find("frozen 1") != std::string::npos)
      return "it is frozen (its cgroup's freezer)";
  }
  return {};
}

namespace {

// Why a process with the shim loaded has no control server, for the message that says so.
std::string why_no_server(pid_t pid, uid_t owner) {
  std::string ordinary = "it starts at the program's first CUDA call, and a child made by fork() has none";
  // A shim of before the private directories gave up its socket file when someone else had made its
  // directory: say so rather than blame the program.
  if (environment_value(pid, "XDG_RUNTIME_DIR").value_or("").empty()) {
    const std::string dir = "/tmp/vmmckpt-" + std::to_string(owner);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && (st.st_uid != owner || !S_ISDIR(st.st_mode)))
      return ordinary + "; or it could not make its socket: " + dir +
             (st.st_uid != owner ? " belongs to another user (uid " + std::to_string(st.st_uid) + ")"
                                 : " is not a directory");
  }
  return ordinary;
}

// The process exists, is this user's, and has not exited. Returns its /proc entry's owner.
uid_t check_live_process(pid_t pid, const std::string& proc, const std::string& who) {
  struct stat st {};
  if (pid <= 0 || ::stat(proc.c_str(), &st) != 0) throw no_such_process("no process " + std::to_string(pid));
  require_own_process(pid);
  if (suspend_claim::start_time(pid) == 0)  // 0: a zombie (or gone since the stat above)
    throw no_such_process(who + " has exited (a zombie: its parent has not reaped it yet)");
  return st.st_uid;
}

// What the addresses tried said, for the error when none of them is the process.
struct connect_attempts {
  std::string tried, stale_file;
  bool nothing_listens = true;  // at every address: a server never started, rather than one out of reach
  protocol::failure timed_out;  // at an address that took no connection: said when no other one is the process

  void failed(const std::string& address, const protocol::failure& error) {
    // Not at once: a name someone else holds may take no connection while the process waits at the next one.
    if (error.kind == protocol::failure_kind::timed_out && timed_out.kind == protocol::failure_kind::none)
      timed_out = error;
    if (error.kind == protocol::failure_kind::connection_refused) stale_file = address;
    if (error.kind != protocol::failure_kind::no_socket) nothing_listens = false;
    tried += (tried.empty() ? "" : "; ") + error.text;
  }
  void served_by_another(const std::string& address, const std::string& who, pid_t server_pid, uid_t server_uid) {
    nothing_listens = false;
    tried += (tried.empty() ? "" : "; ") + protocol::printable_address(address) + " is served by process " +
             std::to_string(server_pid) + " (uid " + std::to_string(server_uid) + "), not by " + who;
  }
};

// No address is the process: says why, as far as can be told (no shim in it, no server, or one out of reach).
[[noreturn]] void throw_unreachable(pid_t pid, const std::string& proc, const std::string& who, uid_t owner,
                                    const connect_attempts& a) {
  std::string comm = read_small_file(proc + "/comm");
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  const std::string named = who + (comm.empty() ? "" : " (" + comm + ")");
  switch (shim_in(pid)) {
    case shim_presence::absent:
      throw not_under_vmmckpt(named + " is not running under vmmckpt: " + std::string(shim_file_name) +
                              " is not loaded in it. vmmckpt serves programs started under it (`cuda-ckpt run -- "
                              "PROGRAM`, or LD_PRELOAD=" +
                              std::string(shim_file_name) +
                              "); for this one, NVIDIA's `cuda-checkpoint --toggle --pid " + std::to_string(pid) +
                              "` (driver 550 or later) suspends its GPU state in place, without fixed addresses or a "
                              "restore elsewhere" +
                              (a.stale_file.empty()
                                   ? ""
                                   : "; " + a.stale_file + " was left by an earlier process with pid " +
                                         std::to_string(pid) + " (`cuda-ckpt gc` removes it)"));
    case shim_presence::loaded:
      if (a.nothing_listens)
        throw no_control_server(named + " runs under vmmckpt (" + std::string(shim_file_name) +
                                " is loaded) but has no control server: " + why_no_server(pid, owner) + " (tried " +
                                a.tried + ")");
      throw tool_error(named + " runs under vmmckpt (" + std::string(shim_file_name) +
                       " is loaded) but its control server cannot be reached: " + a.tried);
    case shim_presence::unknown: break;
  }
  throw tool_error("cannot reach " + named + " (" + a.tried + "), and its /proc/" + std::to_string(pid) +
                   "/maps cannot be read to tell whether it runs under vmmckpt");
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

control_client::control_client(pid_t pid, deadline until) : pid_(pid), deadline_(until) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string who = "process " + std::to_string(pid);
  const uid_t owner = check_live_process(pid, proc, who);
  // Each address in turn, until one answers as the process itself: an abstract name can be held by
  // anyone, and a socket file can be a leftover of an earlier process with this pid.
  connect_attempts attempts;
  for (const std::string& address : control_addresses(pid)) {
    protocol::failure error;
    const int fd = protocol::connect_to(address, remaining_ms(), error);
    if (fd < 0) {
      attempts.failed(address, error);
      continue;
    }
    uid_t server_uid = 0;
    pid_t server_pid = 0;
    if (protocol::peer_credentials(fd, server_uid, server_pid) && server_pid == pid && server_uid == owner) {
      fd_ = fd;
      return;
    }
    ::close(fd);
    attempts.served_by_another(address, who, server_pid, server_uid);
  }
  if (attempts.timed_out.kind != protocol::failure_kind::none) channel_failed(attempts.timed_out);
  throw_unreachable(pid, proc, who, owner, attempts);
}

control_client::control_client(pid_t pid, int connected_fd, std::string node, deadline until)
    : pid_(pid), node_(std::move(node)), deadline_(until), fd_(connected_fd) {
  // send_frame and recv_frame wait with poll, as on the sockets connect_to makes.
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

control_client::~control_client() {
  if (fd_ >= 0) ::close(fd_);
}

void control_client::channel_failed(const protocol::failure& f) const {
  const std::string who = "process " + std::to_string(pid_) + (node_.empty() ? "" : " on " + node_);
  if (f.kind == protocol::failure_kind::connection_closed)
    throw control_error(who + (node_.empty() ? " went away (it exited or its control server stopped)"
                                             : " went away (it exited, or its node's agent did)"),
                        f.kind);
  if (f.kind == protocol::failure_kind::timed_out) {
    const double waited = std::chrono::duration<double>(clock::now() - start_).count();
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", waited);
    const std::string why = node_.empty() ? why_silent(pid_) : std::string();
    throw control_error(who + " did not answer within " + seconds + " s" + (why.empty() ? "" : ": " + why), f.kind);
  }
  throw control_error(who + ": " + f.text, f.kind);
}

void control_client::send(const control::request& r, const std::vector<int>& fds) {
  protocol::failure error;
  if (!protocol::send_frame(fd_, control::encode(r), fds, remaining_ms(), error)) channel_failed(error);
}

std::string control_client::receive(std::vector<int>* fds, int timeout_ms) {
  const auto until = clock::now() + std::chrono::milliseconds(timeout_ms);
  if (while_waiting_ || patience_ < until) {
    // In slices, the checks between them; then the frame itself, or the error, as without a check.
    for (;;) {
      if (while_waiting_) while_waiting_();
      const auto now = clock::now();
      if (now >= patience_ && node_.empty() && !why_silent(pid_).empty())
        channel_failed({protocol::failure_kind::timed_out, "stopped"});
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
      if (left <= 0) break;
      pollfd ready{fd_, POLLIN, 0};
      const int r = ::poll(&ready, 1, static_cast<int>(std::min<long long>(left, 100)));
      if (r < 0 && errno == EINTR) continue;  // the signal the check is for, most likely
      if (r != 0) break;
    }
    timeout_ms = static_cast<int>(std::clamp<long long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count(), 1, INT_MAX));
  }
  std::string payload;
  std::vector<int> received;
  protocol::failure error;
  if (!protocol::recv_frame(fd_, payload, received, timeout_ms, error)) channel_failed(error);
  if (fds != nullptr)
    fds->insert(fds->end(), received.begin(), received.end());
  else
    protocol::close_all(received);  // none expected
  return payload;
}

template <typename Reply>
Reply control_client::call(const control::request& r, std::vector<int>* fds, const progress_handler& progress,
                           const std::vector<int>& send_fds) {
  send(r, send_fds);
  // Tests stop or kill the tool here: the request is out, its answer not read yet.
  std::visit(
      [](const auto& req) {
        using T = std::decay_t<decltype(req)>;
        if constexpr (std::is_same_v<T, control::resume_request>) fault_point("requested:resume");
        if constexpr (std::is_same_v<T, control::suspend_request>) fault_point("requested:suspend");
        if constexpr (std::is_same_v<T, control::dump_begin_request>) fault_point("requested:dump_begin");
      },
      r);
  std::vector<int> mine;
  std::string payload = receive(&mine, remaining_ms());
  try {
    // Progress frames, when asked for, come before the reply.
    if (progress)
      while (const auto frame = control::decode_progress_frame(payload)) {
        progress(*frame);
        protocol::close_all(mine);
        payload = receive(&mine, remaining_ms());
      }
    auto decoded = control::decode_reply<Reply>(payload);
    if (auto* refused = std::get_if<control::failure_reply>(&decoded)) {
      protocol::close_all(mine);
      throw control_error("process " + std::to_string(pid_) + ": " + refused->error, refused->code);
    }
    if (fds != nullptr)
      *fds = std::move(mine);
    else
      protocol::close_all(mine);
    return std::get<Reply>(std::move(decoded));
  } catch (const control::decode_error& e) {
    protocol::close_all(mine);
    throw control_error("process " + std::to_string(pid_) + " sent a malformed reply: " + e.what(),
                        protocol::failure_kind::bad_frame);
  }
}

control::hello_reply control_client::hello(bool prepare_hold) {
  return call<control::hello_reply>(control::hello_request{prepare_hold});
}

control::dump_begin_reply control_client::dump_begin(std::chrono::milliseconds hold_deadline, received_fds& fds,
                                                     bool for_suspend, const std::optional<control::job_suspend>& job) {
  std::vector<int> got;
  struct close_on_failure {
    std::vector<int>& fds;
    bool done = false;
    ~close_on_failure() {
      if (!done) protocol::close_all(fds);
    }
  } guard{got};
  // The reply comes once the program is quiet, which takes at most the hold's deadline: the tool
  // waits a little longer than that for it, for the program's own account of what kept it from being quiet, but
  // not for a program that is stopped: the deadline is met however the program is stopped (docs/reliability.md).
  const auto hold_ends = clock::now() + hold_deadline;
  deadline_ = std::max(deadline_, deadline(hold_ends + std::chrono::seconds(5)));
  patience_ = std::min(patience_, hold_ends);
  auto reply = call<control::dump_begin_reply>(
      control::dump_begin_request{hold_deadline, control::unix_ms_now() + hold_deadline.count(), for_suspend, job},
      &got);
  // More descriptors than one frame carries follow in fds frames.
  while (got.size() < reply.fd_count) {
    const std::string payload = receive(&got, remaining_ms());
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
  read_allocation_table(pid_, table_fd, reply.pools);
  guard.done = true;
  fds = received_fds(std::move(got));
  return reply;
}

control::dump_end_reply control_client::dump_end() {
  return call<control::dump_end_reply>(control::dump_end_request{});
}

control::suspend_reply control_client::suspend(const std::string& image, const std::string& image_id) {
  return call<control::suspend_reply>(control::suspend_request{image, image_id, deadline_.valid_until_ms()});
}

control::resume_reply control_client::resume(const progress_handler& progress, const std::string& image,
                                             control::resume_request::stage stage,
                                             const std::vector<std::int64_t>& ranks) {
  return call<control::resume_reply>(
      control::resume_request{deadline_.valid_until_ms(), static_cast<bool>(progress), image, stage, ranks}, nullptr,
      progress);
}

control::cut_status control_client::cut_arm(std::chrono::milliseconds armed_for) {
  return call<control::cut_status>(control::cut_arm_request{armed_for, deadline_.valid_until_ms()});
}

void control_client::cut_targets(const std::vector<control::comm_count>& targets, bool freeze) {
  send(control::cut_targets_request{targets, freeze});
}

std::optional<control::cut_status> control_client::next_cut_status(int wait_ms) {
  pollfd ready{fd_, POLLIN, 0};
  if (::poll(&ready, 1, wait_ms) <= 0) return std::nullopt;
  const std::string payload = receive(nullptr, remaining_ms());
  try {
    auto decoded = control::decode_reply<control::cut_status>(payload);
    if (auto* refused = std::get_if<control::failure_reply>(&decoded))
      throw control_error("process " + std::to_string(pid_) + ": " + refused->error, refused->code);
    return std::get<control::cut_status>(std::move(decoded));
  } catch (const control::decode_error& e) {
    throw control_error("process " + std::to_string(pid_) + " sent a malformed cut status: " + e.what(),
                        protocol::failure_kind::bad_frame);
  }
}

control::check_reply control_client::check() { return call<control::check_reply>(control::check_request{}); }

control::peek_reply control_client::peek(control::peek_request request, received_fds& fds) {
  request.valid_until_ms = deadline_.valid_until_ms();
  std::vector<int> got;
  auto reply = call<control::peek_reply>(request, &got);
  const std::size_t expected = reply.via == control::peek_path::copy ? 1 : reply.pieces.size();
  fds = received_fds(std::move(got));
  if (fds.size() != expected)
    throw control_error("process " + std::to_string(pid_) + " sent " + std::to_string(fds.size()) +
                            " descriptors with its peek, expected " + std::to_string(expected),
                        protocol::failure_kind::bad_frame);
  return reply;
}

control::poke_reply control_client::poke(control::poke_request request, int bytes_fd) {
  request.valid_until_ms = deadline_.valid_until_ms();
  return call<control::poke_reply>(request, nullptr, {}, {bytes_fd});
}

control::regions_reply control_client::regions() {
  std::vector<int> got;
  auto reply = call<control::regions_reply>(control::regions_request{}, &got);
  received_fds owned(std::move(got));
  if (owned.size() != 1)
    throw control_error("process " + std::to_string(pid_) + " sent no allocation table with its regions",
                        protocol::failure_kind::bad_frame);
  const int table_fd = owned.take(0);
  read_allocation_table(pid_, table_fd, reply.pools);
  return reply;
}

}  // namespace vmmckpt::ckpt
