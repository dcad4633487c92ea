// The control server: threads in the program that answer cuda-ckpt over a Unix socket (docs/protocol.md).
//
// One thread accepts; each connection is served by a thread of its own, so that a client that is
// slow, silent or hostile holds up nobody else. Operations that change the process (a hold for a
// dump or suspend, a resume) take one lock, each for at most its request's deadline; hello and
// check never wait for it.
#include "control_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "gate.hpp"
#include "ipc_exports.hpp"
#include "process_control.hpp"
#include "self_pause.hpp"
#include "vmm_sharing.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::detail {
namespace {

using clock = std::chrono::steady_clock;

constexpr int idle_timeout_ms = 30'000;            // a client that says nothing is dropped
constexpr int reply_timeout_ms = 10'000;           // a client that reads nothing is dropped
constexpr int max_hold_deadline_ms = 3'600'000;    // the longest hold a tool may ask for
constexpr int max_connections = 32;                // served at once; more are answered `busy`
// An IPC open waits for a dump in progress to end; the importer waits a little longer (ipc_imports.cpp).
constexpr auto ipc_open_wait = std::chrono::seconds(50);

std::atomic<int> g_connections{0};
// What the connection that holds operation_lock() is doing, for hello to report without waiting for it.
std::atomic<control::activity> g_activity{control::activity::idle};

// Sets g_activity for a scope: the operation's, under operation_lock().
struct activity_scope {
  explicit activity_scope(control::activity a) { g_activity.store(a); }
  void change(control::activity a) { g_activity.store(a); }
  ~activity_scope() { g_activity.store(control::activity::idle); }
  activity_scope(const activity_scope&) = delete;
  activity_scope& operator=(const activity_scope&) = delete;
};


bool send(int fd, const std::string& payload, const std::vector<int>& fds = {}) {
  protocol::failure error;
  if (protocol::send_frame(fd, payload, fds, reply_timeout_ms, error)) return true;
  // A tool that went away (killed, or gave up) is no fault of the program's: said at the info level, so that the
  // program's stderr (often a file a whole-process image holds at its size) is not written for it.
  if (error.kind == protocol::failure_kind::connection_closed)
    log::info("control: reply failed: {}", error.text);
  else
    log::warn("control: reply failed: {}", error.text);
  return false;
}

bool refuse(int fd, control::refusal code, const std::string& why) {
  return send(fd, control::encode(control::failure_reply{code, why}));
}

// Sends the hold's reply and the exported handles, in as many frames as the descriptors need.
bool send_held(int fd, const control::dump_begin_reply& reply, const std::vector<int>& fds) {
  const std::size_t first = std::min<std::size_t>(fds.size(), protocol::max_fds_per_message);
  bool sent = send(fd, control::encode(reply), {fds.begin(), fds.begin() + static_cast<long>(first)});
  for (std::size_t i = first; sent && i < fds.size(); i += protocol::max_fds_per_message) {
    const std::size_t n = std::min<std::size_t>(fds.size() - i, protocol::max_fds_per_message);
    sent = send(fd, control::encode(control::fds_frame{static_cast<std::uint32_t>(n)}),
                {fds.begin() + static_cast<long>(i), fds.begin() + static_cast<long>(i + n)});
  }
  return sent;
}

// The operation lock, waited for until the request is void; false (and a reply saying so) when
// another operation kept it that long.
bool take_operation(int fd, std::unique_lock<std::timed_mutex>& lock, std::int64_t valid_until_ms) {
  const std::int64_t left_ms = valid_until_ms - control::unix_ms_now();
  if (left_ms > 0 && lock.try_lock_for(std::chrono::milliseconds(left_ms))) return true;
  refuse(fd, left_ms > 0 ? control::refusal::busy : control::refusal::expired,
         left_ms > 0 ? "another operation (a dump, suspend or resume) kept the program busy until the request's deadline"
                     : "the request arrived after it expired; nothing was done");
  return false;
}

// dump_begin: the program is held until the client says dump_end (or suspend), goes away, or the
// deadline passes; the gate is open again in every case but suspend.
void serve_hold(int fd, const control::dump_begin_request& request) {
  if (request.deadline_ms <= 0 || request.deadline_ms > max_hold_deadline_ms) {
    refuse(fd, control::refusal::bad_request,
           "deadline_ms " + std::to_string(request.deadline_ms) + " is out of range (1 to " +
               std::to_string(max_hold_deadline_ms) + ")");
    return;
  }
  std::unique_lock operation(operation_lock(), std::defer_lock);
  if (!take_operation(fd, operation, request.valid_until_ms)) return;
  if (request.for_suspend) {
    // Their mappings keep the physical memory a suspend would give back, and they would not see what resume
    // loads: refused (docs/ipc.md). Checked under the operation lock, which an IPC open takes too.
    if (const auto importers = live_importers(); !importers.empty()) {
      std::string pids;
      for (pid_t p : importers) pids += (pids.empty() ? "" : ", ") + std::to_string(p);
      refuse(fd, control::refusal::failed,
             "other processes map this program's GPU memory through CUDA IPC (pid " + pids +
                 "); a suspend would take it from under them. Suspend or stop them first, or have them close "
                 "their handles (cudaIpcCloseMemHandle)");
      return;
    }
    if (const auto importers = vmm_importers(); !importers.empty()) {
      std::string pids;
      for (pid_t p : importers) pids += (pids.empty() ? "" : ", ") + std::to_string(p);
      refuse(fd, control::refusal::failed,
             "other processes map this program's VMM memory, imported from POSIX FDs it exported (pid " + pids +
                 "; NCCL's P2P and SHM transports do this between the ranks of a job); a suspend would take it "
                 "from under them. Stop them first, or checkpoint the job with dump instead");
      return;
    }
  }
  activity_scope busy(request.for_suspend ? control::activity::suspending : control::activity::dumping);
  // The hold lasts deadline_ms from now, whatever time the request spent waiting.
  const auto deadline = clock::now() + std::chrono::milliseconds(request.deadline_ms);
  std::vector<int> fds;
  auto held = hold(deadline, fds);
  if (auto* reply = std::get_if<control::dump_begin_reply>(&held)) reply->hold_ms = request.deadline_ms;
  if (auto* refused = std::get_if<control::failure_reply>(&held)) {
    protocol::close_all(fds);
    send(fd, control::encode(*refused));
    return;
  }
  // From here the program is held: however this function leaves (an exception included), it is
  // released, or suspended on purpose.
  struct held_guard {
    bool settled = false;
    ~held_guard() {
      if (!settled && !is_suspended()) release("a request failed unexpectedly");
    }
  } guard;
  const bool sent = send_held(fd, std::get<control::dump_begin_reply>(held), fds);
  protocol::close_all(fds);  // the client has its own copies now
  fault_point("program:held");
  if (!sent) {
    guard.settled = true;
    release("client gone before the handles were sent");
    return;
  }

  // Held until the client is done copying out of the GPU.
  std::string payload;
  std::vector<int> ignored;
  protocol::failure error;
  const int left_ms = static_cast<int>(
      std::max<long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count()));
  const bool received = protocol::recv_frame(fd, payload, ignored, left_ms, error);
  protocol::close_all(ignored);
  if (!received) {
    guard.settled = true;
    release(error.kind == protocol::failure_kind::timed_out ? "deadline passed" : "client went away");
    return;
  }
  const auto decoded = control::decode_request(payload);
  const auto* next = std::get_if<control::request>(&decoded);
  if (next != nullptr) {
    if (const auto* s = std::get_if<control::suspend_request>(next)) {
      // Accepted, the gate stays closed: threads that call CUDA wait until resume. (suspend_held
      // releases the program itself when it does not suspend it.)
      busy.change(control::activity::suspending);
      const auto outcome = suspend_held(*s);
      guard.settled = true;
      std::visit([&](const auto& reply) { send(fd, control::encode(reply)); }, outcome);
      return;
    }
    if (std::holds_alternative<control::dump_end_request>(*next)) {
      guard.settled = true;
      send(fd, control::encode(control::dump_end_reply{release("dump finished")}));
      return;
    }
  }
  guard.settled = true;
  release("the client sent something else than dump_end or suspend");
  refuse(fd, control::refusal::bad_request, "expected dump_end or suspend");
}

void serve_resume(int fd, const control::resume_request& request) {
  std::unique_lock operation(operation_lock(), std::defer_lock);
  if (!take_operation(fd, operation, request.valid_until_ms)) return;
  activity_scope busy(control::activity::resuming);
  // Progress frames are best effort (upload() reports at most ten a second): each is given a short
  // while to leave, and none follows one that could not (a tool that stopped reading must not slow
  // the load).
  bool sending = true;
  restore::upload_progress progress;
  if (request.progress)
    progress = [&](std::uint64_t done, std::uint64_t total) {
      if (!sending) return;
      protocol::failure error;
      sending = protocol::send_frame(fd, control::encode(control::progress_frame{done, total}), {}, 200, error);
    };
  std::visit([&](const auto& reply) { send(fd, control::encode(reply)); }, resume(request, progress));
}

// ipc_open: the physical memory under an exported allocation, to the process that opens its handle.
void serve_ipc_open(int fd, const control::ipc_open_request& request) {
  uid_t uid = 0;
  pid_t importer = 0;
  if (!protocol::peer_credentials(fd, uid, importer)) {
    refuse(fd, control::refusal::failed, "cannot tell which process asks");
    return;
  }
  // Not while a dump holds the program or a suspend gives its memory back.
  std::unique_lock operation(operation_lock(), std::defer_lock);
  if (!operation.try_lock_for(ipc_open_wait)) {
    refuse(fd, control::refusal::busy, "another operation (a dump, suspend or resume) kept the program busy");
    return;
  }
  if (is_suspended() || is_self_paused()) {
    refuse(fd, control::refusal::suspended, "the program's GPU memory is given back (suspended or paused)");
    return;
  }
  std::vector<int> fds;
  const auto outcome = open_export(request, importer, fds);
  std::visit([&](const auto& reply) { send(fd, control::encode(reply), fds); }, outcome);
  protocol::close_all(fds);
}

// The process a peer connection comes from; 0 when the kernel does not say.
pid_t peer_pid(int fd) {
  uid_t uid = 0;
  pid_t pid = 0;
  return protocol::peer_credentials(fd, uid, pid) ? pid : 0;
}

// vmm_identify: which handle of this process the FD the request carried is (vmm_sharing.hpp).
bool serve_vmm_identify(int fd, const std::vector<int>& fds) {
  if (fds.size() != 1)
    return refuse(fd, control::refusal::bad_request, "vmm_identify carries one descriptor, the FD imported");
  return std::visit([&](const auto& reply) { return send(fd, control::encode(reply)); }, identify_export(fds[0], peer_pid(fd)));
}

// vmm_share: a new FD of a handle, for a restored importer. Not while a suspend gives the memory back.
bool serve_vmm_share(int fd, const control::vmm_share_request& request) {
  std::unique_lock operation(operation_lock(), std::defer_lock);
  if (!operation.try_lock_for(ipc_open_wait))
    return refuse(fd, control::refusal::busy, "another operation (a dump, suspend or resume) kept the program busy");
  std::vector<int> fds;
  const auto outcome = share_handle(request.token, peer_pid(fd), fds);
  const bool sent = std::visit([&](const auto& reply) { return send(fd, control::encode(reply), fds); }, outcome);
  protocol::close_all(fds);
  return sent;
}

// Answers one request, with the descriptors it carried (the caller closes them); false when the connection
// is to be closed.
bool serve_request(int fd, const control::request& request, const std::vector<int>& fds) {
  return std::visit(
      [&](const auto& r) -> bool {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, control::hello_request>) {
          control::hello_reply reply = describe_process();
          reply.activity = g_activity.load();
          if (!send(fd, control::encode(reply))) return false;
          // After the answer: the tool prepares its side meanwhile.
          if (r.prepare_hold && !is_suspended() && !is_self_paused()) prepare_hold();
          return true;
        } else if constexpr (std::is_same_v<T, control::check_request>) {
          return send(fd, control::encode(check_pools()));
        } else if constexpr (std::is_same_v<T, control::dump_begin_request>) {
          serve_hold(fd, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::resume_request>) {
          serve_resume(fd, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::ipc_open_request>) {
          serve_ipc_open(fd, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::ipc_close_request>) {
          uid_t uid = 0;
          pid_t importer = 0;
          if (protocol::peer_credentials(fd, uid, importer)) close_export(r, importer);
          return send(fd, control::encode(control::ipc_close_reply{}));
        } else if constexpr (std::is_same_v<T, control::vmm_identify_request>) {
          return serve_vmm_identify(fd, fds);
        } else if constexpr (std::is_same_v<T, control::vmm_share_request>) {
          return serve_vmm_share(fd, r);
        } else if constexpr (std::is_same_v<T, control::vmm_unshare_request>) {
          unshare_handle(r.token, peer_pid(fd));
          return send(fd, control::encode(control::vmm_unshare_reply{}));
        } else {
          // dump_end or suspend with no hold in progress.
          static_assert(std::is_same_v<T, control::dump_end_request> || std::is_same_v<T, control::suspend_request>);
          return refuse(fd, control::refusal::not_held,
                        "no dump in progress: the program was already released (the hold deadline passed)");
        }
      },
      request);
}

void serve_client(int fd) {
  for (;;) {
    std::string payload;
    std::vector<int> fds;
    protocol::failure error;
    if (!protocol::recv_frame(fd, payload, fds, idle_timeout_ms, error)) {
      protocol::close_all(fds);
      if (error.kind != protocol::failure_kind::connection_closed) log::debug("control: {}", error.text);
      return;
    }
    // Only vmm_identify carries a descriptor; any other request's are closed unread.
    struct closer {
      std::vector<int>& fds;
      ~closer() { protocol::close_all(fds); }
    } close_them{fds};
    const auto decoded = control::decode_request(payload);
    if (const auto* refused = std::get_if<control::failure_reply>(&decoded)) {
      if (!send(fd, control::encode(*refused))) return;
      continue;
    }
    if (!serve_request(fd, std::get<control::request>(decoded), fds)) return;
  }
}

void* serve_connection(void* arg) {
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(arg));
  try {
    serve_client(fd);
  } catch (...) {
    log::warn("control: a request failed unexpectedly");
  }
  ::close(fd);
  g_connections.fetch_sub(1);
  return nullptr;
}

// Where the server listens: its abstract name and its socket file (docs/protocol.md), either of
// which may be missing (-1) when it could not be made.
struct listeners {
  int fd[2] = {-1, -1};
};

// The next connection on any listener; -1 with errno when accepting failed, or with ETIMEDOUT when none came
// within timeout_ms (-1: no limit).
int accept_next(const listeners& on, int timeout_ms) {
  pollfd p[2];
  nfds_t n = 0;
  for (int f : on.fd)
    if (f >= 0) p[n++] = {f, POLLIN, 0};
  for (;;) {
    const int ready = ::poll(p, n, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (ready == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    for (nfds_t i = 0; i < n; ++i) {
      if (p[i].revents == 0) continue;
      // Non-blocking: a client that gave up between poll and accept leaves nothing to wait for.
      const int fd = accept4(p[i].fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        // The transport waits with poll itself; the served connection is a blocking socket as before.
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        return fd;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
  }
}

// Refused connections, logged at most once a second: the first at once, those that follow within the second
// as one line with their count when it is over. Another user reconnecting in a loop must neither flood the
// program's stderr nor slow it down. Only the accepting thread uses it.
class refusal_log {
 public:
  void note(uid_t uid, pid_t pid) {
    ++unlogged_;
    uid_ = uid;
    pid_ = pid;
    if (clock::now() - last_ >= std::chrono::seconds(1)) flush();
  }
  // How long the accepting thread may wait before the refusals counted since the last line are due: -1 (no
  // limit) when there are none.
  int wait_ms() const {
    if (unlogged_ == 0) return -1;
    const auto due = last_ + std::chrono::seconds(1) - clock::now();
    return std::max<int>(0, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(due).count()));
  }
  void flush() {
    if (unlogged_ == 1)
      log::warn("control: refused a connection from uid {} (pid {}): only the same user or root may connect", uid_,
                pid_);
    else if (unlogged_ > 1)
      log::warn("control: refused {} connections within a second, the last from uid {} (pid {}): only the same user "
                "or root may connect", unlogged_, uid_, pid_);
    unlogged_ = 0;
    last_ = clock::now();
  }

 private:
  unsigned long unlogged_ = 0;
  uid_t uid_ = 0;
  pid_t pid_ = 0;
  clock::time_point last_{};
};

void serve(const listeners& on) {
  refusal_log refusals;
  for (;;) {
    const int fd = accept_next(on, refusals.wait_ms());
    if (fd < 0) {
      if (errno == ETIMEDOUT) {
        refusals.flush();
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
        ::poll(nullptr, 0, 100);  // out of descriptors or memory for now: later
        continue;
      }
      log::warn("control: accept failed ({}); the control server stops", errno);
      return;
    }
    uid_t uid = 0;
    pid_t pid = 0;
    if (!protocol::peer_allowed(fd, uid, pid)) {
      close(fd);
      refusals.note(uid, pid);
      continue;
    }
    pthread_t thread;
    if (g_connections.fetch_add(1) >= max_connections ||
        pthread_create(&thread, nullptr, serve_connection, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd))) != 0) {
      g_connections.fetch_sub(1);
      protocol::failure ignored;
      protocol::send_frame(fd,
                           control::encode(control::failure_reply{
                               control::refusal::busy, "the program serves " + std::to_string(max_connections) +
                                                           " connections already; try again"}),
                           {}, 100, ignored);
      close(fd);
      continue;
    }
    pthread_detach(thread);
  }
}

std::string g_socket_path;
pid_t g_socket_owner = 0;

// At exit, by the process that made the socket only: a fork() child inherits this atexit handler, and
// its exit must not cut its parent off from cuda-ckpt.
void remove_socket() {
  if (!g_socket_path.empty() && getpid() == g_socket_owner) unlink(g_socket_path.c_str());
}

}  // namespace

std::timed_mutex& operation_lock() {
  static std::timed_mutex* lock = new std::timed_mutex;  // never destroyed: threads may call at exit
  return *lock;
}

void start_control_server() noexcept {
  static std::once_flag once;
  try {
    std::call_once(once, [] {
      // Two doors to one server: the abstract name finds the process whatever its environment; the
      // file serves tools in another network namespace, and stays the door when someone else holds
      // the name. Either one is enough.
      static listeners on;
      protocol::failure error;
      const std::string abstract = protocol::abstract_address(getpid());
      on.fd[0] = protocol::listen_at(abstract, error);
      if (on.fd[0] < 0) log::warn("control: {}; cuda-ckpt finds this process by its socket file only", error.text);
      std::string path;
      if (!protocol::ensure_runtime_dir(error)) {
        log::warn("control: no control socket file ({})", error.text);
      } else {
        path = protocol::socket_path(getpid());
        on.fd[1] = protocol::listen_at(path, error);
        if (on.fd[1] < 0) {
          log::warn("control: cannot listen at {} ({})", path, error.text);
          path.clear();
        }
      }
      if (on.fd[0] < 0 && on.fd[1] < 0) {
        log::warn("control: no control socket at all; cuda-ckpt cannot reach this process");
        return;
      }
      // A fork() child has no server thread: it lets go of the parent's doors, so that a name it kept
      // alive (past the parent's end) never takes connections nobody accepts. close() is safe there.
      pthread_atfork(nullptr, nullptr, [] {
        for (int& f : on.fd)
          if (f >= 0) {
            close(f);
            f = -1;
          }
      });
      if (!path.empty()) {
        g_socket_path = path;
        g_socket_owner = getpid();
        std::atexit(remove_socket);
      }
      // The server's threads take no signals: they stay the program's. (Threads inherit the mask.)
      sigset_t all, previous;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, &previous);
      pthread_t thread;
      const int started = pthread_create(
          &thread, nullptr,
          [](void*) -> void* {
            serve(on);
            return nullptr;
          },
          nullptr);
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      if (started != 0) {
        log::warn("control: cannot start the server thread ({})", started);
        for (int& f : on.fd)
          if (f >= 0) close(f);
        if (!path.empty()) unlink(path.c_str());
        return;
      }
      pthread_detach(thread);
      log::info("control: listening at {}{}{}", on.fd[0] >= 0 ? protocol::printable_address(abstract) : "",
                on.fd[0] >= 0 && !path.empty() ? " and " : "", path);
    });
  } catch (...) {
    log::warn("control: cannot start the control server (out of memory); cuda-ckpt cannot reach this process");
  }
}

}  // namespace vmmckpt::detail
