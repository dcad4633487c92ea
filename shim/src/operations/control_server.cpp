// The control server: threads in the program that carry cuda-ckpt's requests over a Unix socket
// (docs/protocol.md) to the operations (operations.cpp) and their replies back. Transport only.
//
// One thread accepts; each connection is served by a thread of its own, so that a client that is
// slow, silent or hostile holds up nobody else.
#include "operations/control_server.hpp"

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

#include "operations/operations.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::detail {
namespace {

using clock = std::chrono::steady_clock;

constexpr int idle_timeout_ms = 30'000;   // a client that says nothing is dropped
constexpr int reply_timeout_ms = 10'000;  // a client that reads nothing is dropped
constexpr int max_connections = 32;       // served at once; more are answered `busy`
std::atomic<int> g_connections{0};

// A connection's channel: frames with the transport's own limits, failures logged at the level they deserve.
class connection final : public client_channel {
 public:
  explicit connection(int fd) : fd_(fd) {}
  bool send(const std::string& payload, const std::vector<int>& fds = {}) override {
    protocol::failure error;
    if (protocol::send_frame(fd_, payload, fds, reply_timeout_ms, error)) return true;
    // A tool that went away (killed, or gave up) is no fault of the program's: said at the info level, so that
    // the program's stderr (often a file a whole-process image holds at its size) is not written for it.
    if (error.kind == protocol::failure_kind::connection_closed)
      log::info("control: reply failed: {}", error.text);
    else
      log::warn("control: reply failed: {}", error.text);
    return false;
  }
  bool send_within(const std::string& payload, std::chrono::milliseconds wait) override {
    protocol::failure error;
    return protocol::send_frame(fd_, payload, {}, static_cast<int>(wait.count()), error);
  }
  bool receive(std::string& payload, std::vector<int>& fds, std::chrono::milliseconds wait,
               protocol::failure& error) override {
    return protocol::recv_frame(fd_, payload, fds, static_cast<int>(wait.count()), error);
  }
  pid_t peer_pid() override {
    uid_t uid = 0;
    pid_t pid = 0;
    return protocol::peer_credentials(fd_, uid, pid) ? pid : 0;
  }
  bool readable(std::chrono::milliseconds wait) override {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(wait.count())) > 0;
  }

 private:
  int fd_;
};

void serve_client(int fd) {
  connection client(fd);
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
      if (!client.send(control::encode(*refused))) return;
      continue;
    }
    if (!answer(client, std::get<control::request>(decoded), fds)) return;
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
                "or root may connect",
                unlogged_, uid_, pid_);
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
        pthread_create(&thread, nullptr, serve_connection, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd))) !=
            0) {
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
std::string g_private_dir;  // the directory of our own the socket file is in, when it is not runtime_dir()
pid_t g_socket_owner = 0;

// At exit, by the process that made the socket only: a fork() child inherits this atexit handler, and
// its exit must not cut its parent off from cuda-ckpt.
void remove_socket() {
  if (g_socket_path.empty() || getpid() != g_socket_owner) return;
  unlink(g_socket_path.c_str());
  if (!g_private_dir.empty()) rmdir(g_private_dir.c_str());
}

// The socket file: in runtime_dir(), or, when that cannot be used (someone else made /tmp/vmmckpt-UID first,
// or planted a symlink there), in a private directory of our own that nobody can make first. `path` and
// `private_dir` are set to what was made (empty when nothing was). -1 when there is no socket file.
int listen_at_file(std::string& path, std::string& private_dir) {
  protocol::failure error;
  if (protocol::ensure_runtime_dir(error)) {
    path = protocol::socket_path(getpid());
    const int fd = protocol::listen_at(path, error);
    if (fd >= 0) return fd;
    log::warn("control: cannot listen at {} ({})", path, error.text);
  } else {
    log::warn("control: {}; the socket file goes to a private directory instead", error.text);
  }
  path.clear();
  private_dir = protocol::make_private_dir(error);
  if (private_dir.empty()) {
    log::warn("control: no control socket file ({})", error.text);
    return -1;
  }
  path = private_dir + "/" + std::to_string(getpid()) + ".sock";
  const int fd = protocol::listen_at(path, error);
  if (fd >= 0) return fd;
  log::warn("control: no control socket file ({})", error.text);
  rmdir(private_dir.c_str());
  path.clear();
  private_dir.clear();
  return -1;
}

}  // namespace

void start_control_server() noexcept {
  static std::once_flag once;
  try {
    std::call_once(once, [] {
      // Two doors to one server: the abstract name finds the process whatever its environment; the
      // file serves tools in another network namespace. Either one is enough, and another user can
      // take neither first: a held name gives way to a random one, a planted directory to a private one.
      static listeners on;
      protocol::failure error;
      std::string abstract;
      on.fd[0] = protocol::listen_abstract_for(getpid(), abstract, error);
      if (on.fd[0] < 0) log::warn("control: {}; cuda-ckpt finds this process by its socket file only", error.text);
      std::string path, private_dir;
      on.fd[1] = listen_at_file(path, private_dir);
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
        g_private_dir = private_dir;
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
        if (!private_dir.empty()) rmdir(private_dir.c_str());
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
