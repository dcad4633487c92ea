// The control server: a thread in the program that answers cuda-ckpt over a Unix socket (docs/protocol.md).
#include "control_server.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "gate.hpp"
#include "process_control.hpp"
#include "vmmckpt/control_messages.hpp"
#include "vmmckpt/log.hpp"
#include "vmmckpt/protocol.hpp"

namespace vmmckpt::detail {
namespace {

using clock = std::chrono::steady_clock;

constexpr int idle_timeout_ms = 30'000;           // a client that says nothing is dropped
constexpr int default_hold_deadline_ms = 60'000;  // longest a dump may hold the program
constexpr int max_hold_deadline_ms = 600'000;

void close_all(std::vector<int>& fds) {
  for (int f : fds) ::close(f);
  fds.clear();
}

bool send(int fd, const std::string& payload, const std::vector<int>& fds = {}) {
  protocol::failure error;
  if (protocol::send_frame(fd, payload, fds, error)) return true;
  log::warn("control: reply failed: {}", error.text);
  return false;
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

// dump_begin: the program is held until the client says dump_end (or suspend), goes away, or the
// deadline passes; the gate is open again in every case but suspend.
void serve_hold(int fd, const control::dump_begin_request& request) {
  int deadline_ms = request.deadline_ms;
  if (deadline_ms <= 0 || deadline_ms > max_hold_deadline_ms) deadline_ms = default_hold_deadline_ms;
  const auto deadline = clock::now() + std::chrono::milliseconds(deadline_ms);
  std::vector<int> fds;
  auto held = hold(deadline, fds);
  if (auto* refused = std::get_if<control::failure_reply>(&held)) {
    close_all(fds);
    send(fd, control::encode(*refused));
    return;
  }
  const bool sent = send_held(fd, std::get<control::dump_begin_reply>(held), fds);
  close_all(fds);  // the client has its own copies now
  if (!sent) {
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
  close_all(ignored);
  if (!received) {
    release(error.kind == protocol::failure_kind::timed_out ? "deadline passed" : "client went away");
    return;
  }
  const auto decoded = control::decode_request(payload);
  const auto* next = std::get_if<control::request>(&decoded);
  if (next != nullptr) {
    if (const auto* s = std::get_if<control::suspend_request>(next)) {
      // The gate stays closed: threads that call CUDA wait until resume.
      send(fd, control::encode(suspend_held(s->image)));
      return;
    }
    if (std::holds_alternative<control::dump_end_request>(*next)) {
      send(fd, control::encode(control::dump_end_reply{release("dump finished")}));
      return;
    }
  }
  release("the client sent something else than dump_end or suspend");
  send(fd, control::encode(control::failure_reply{control::refusal::bad_request, "expected dump_end or suspend"}));
}

// Answers one request; false when the connection is to be closed.
bool serve_request(int fd, const control::request& request) {
  return std::visit(
      [&](const auto& r) -> bool {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, control::hello_request>) {
          return send(fd, control::encode(describe_process()));
        } else if constexpr (std::is_same_v<T, control::check_request>) {
          return send(fd, control::encode(check_pools()));
        } else if constexpr (std::is_same_v<T, control::dump_begin_request>) {
          serve_hold(fd, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::resume_request>) {
          return std::visit([&](const auto& reply) { return send(fd, control::encode(reply)); }, resume());
        } else {
          // dump_end or suspend with no hold in progress.
          static_assert(std::is_same_v<T, control::dump_end_request> || std::is_same_v<T, control::suspend_request>);
          return send(fd, control::encode(control::failure_reply{
                              control::refusal::not_held,
                              "no dump in progress: the program was already released (the hold deadline passed)"}));
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
      close_all(fds);
      if (error.kind != protocol::failure_kind::connection_closed) log::debug("control: {}", error.text);
      return;
    }
    close_all(fds);  // clients send none
    const auto decoded = control::decode_request(payload);
    if (const auto* refused = std::get_if<control::failure_reply>(&decoded)) {
      if (!send(fd, control::encode(*refused))) return;
      continue;
    }
    if (!serve_request(fd, std::get<control::request>(decoded))) return;
  }
}

void serve(int listener) {
  for (;;) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      log::warn("control: accept failed ({}); the control server stops", errno);
      return;
    }
    uid_t uid = 0;
    pid_t pid = 0;
    if (!protocol::peer_allowed(fd, uid, pid)) {
      log::warn("control: refused a connection from uid {} (pid {}): only the same user or root may connect", uid, pid);
      close(fd);
      continue;
    }
    try {
      serve_client(fd);
    } catch (...) {
      if (!is_suspended()) the_gate().open();  // never leave a running program held
      log::warn("control: a request failed unexpectedly");
    }
    close(fd);
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

void start_control_server() noexcept {
  static std::once_flag once;
  try {
    std::call_once(once, [] {
      protocol::failure error;
      if (!protocol::ensure_runtime_dir(error)) {
        log::warn("control: no control socket ({}); cuda-ckpt cannot reach this process", error.text);
        return;
      }
      const std::string path = protocol::socket_path(getpid());
      const int listener = protocol::listen_at(path, error);
      if (listener < 0) {
        log::warn("control: cannot listen at {} ({}); cuda-ckpt cannot reach this process", path, error.text);
        return;
      }
      g_socket_path = path;
      g_socket_owner = getpid();
      std::atexit(remove_socket);
      // The server thread takes no signals: they stay the program's.
      sigset_t all, previous;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, &previous);
      pthread_t thread;
      const int started = pthread_create(
          &thread, nullptr,
          [](void* arg) -> void* {
            serve(static_cast<int>(reinterpret_cast<std::intptr_t>(arg)));
            return nullptr;
          },
          reinterpret_cast<void*>(static_cast<std::intptr_t>(listener)));
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      if (started != 0) {
        log::warn("control: cannot start the server thread ({})", started);
        close(listener);
        unlink(path.c_str());
        return;
      }
      pthread_detach(thread);
      log::info("control: listening at {}", path);
    });
  } catch (...) {
    log::warn("control: cannot start the control server (out of memory); cuda-ckpt cannot reach this process");
  }
}

}  // namespace vmmckpt::detail
