// TCP links between a job's coordinator and its nodes' agents: addresses, the shared secret, JSON lines.
#include "job/node_link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/job_nodes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::ckpt {
namespace {

constexpr std::size_t max_line = 1u << 20;
constexpr std::size_t min_token = 16;

std::string errno_text(int e) { return std::strerror(e); }


// Waits for `events` on fd until the deadline: false when it passed first.
bool wait_for(int fd, short events, deadline until) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, until.remaining_ms(0, 24 * 3600 * 1000));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

struct free_addrinfo {
  void operator()(addrinfo* list) const { ::freeaddrinfo(list); }
};
using addrinfo_list = std::unique_ptr<addrinfo, free_addrinfo>;

addrinfo_list resolve(const node_address& a, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(a.host.empty() ? nullptr : a.host.c_str(), a.port.c_str(), &hints, &list);
  if (rc != 0) throw tool_error(a.text() + ": " + ::gai_strerror(rc));
  return addrinfo_list(list);
}

}  // namespace

std::string peer_name(const sockaddr_storage& address) {
  const auto* sa = reinterpret_cast<const sockaddr*>(&address);
  char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
  const socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::getnameinfo(sa, len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return "?";
  return sa->sa_family == AF_INET6 ? "[" + std::string(host) + "]:" + port : std::string(host) + ":" + port;
}

std::string node_address::text() const {
  return host.find(':') != std::string::npos ? "[" + host + "]:" + port : host + ":" + port;
}

node_address parse_node_address(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) throw tool_error("\"" + text + "\" is no HOST:PORT");
  node_address a{text.substr(0, colon), text.substr(colon + 1)};
  if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']') a.host = a.host.substr(1, a.host.size() - 2);
  if (!std::all_of(a.port.begin(), a.port.end(), [](char c) { return c >= '0' && c <= '9'; }) || a.port.size() > 5 ||
      std::stoi(a.port) > 65535)
    throw tool_error("\"" + text + "\": the port is no number from 0 to 65535");
  return a;
}

std::string read_token_file(const std::filesystem::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) throw tool_error(file.string() + ": " + errno_text(errno));
  if ((st.st_mode & 077) != 0)
    throw tool_error(file.string() + ": others than its owner may read or write it (chmod 600 " + file.string() +
                     "): it holds the secret that lets a coordinator hold the job's ranks");
  if (!S_ISREG(st.st_mode)) throw tool_error(file.string() + ": not a regular file");
  std::ifstream in(file);
  std::string token;
  if (!std::getline(in, token) && !in.eof()) throw tool_error(file.string() + ": cannot be read");
  if (token.size() < min_token)
    throw tool_error(file.string() + ": its first line, the job's secret, needs at least " + std::to_string(min_token) +
                     " characters");
  return token;
}

bool same_token(const std::string& a, const std::string& b) noexcept {
  if (a.size() != b.size()) return false;  // the length is no secret
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

node_link::node_link(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // the cut's messages are small and waited for
  // A peer whose host vanished (no FIN, no RST) is found within about 25 s, not when a long wait ends.
  const int idle_s = 10, interval_s = 5, probes = 3;
  ::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

node_link::node_link(node_link&& other) noexcept
    : fd_(other.fd_), peer_(std::move(other.peer_)), buffer_(std::move(other.buffer_)) {
  other.fd_ = -1;
}

node_link::~node_link() {
  if (fd_ >= 0) ::close(fd_);
}

node_link node_link::connect(const node_address& to, deadline until, const std::string& name) {
  const auto found = resolve(to, false);
  std::string why = "no address";
  for (const addrinfo* ai = found.get(); ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      why = errno_text(errno);
      continue;
    }
    int error = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        socklen_t len = sizeof error;
        error = wait_for(fd, POLLOUT, until) ? 0 : ETIMEDOUT;
        if (error == 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      }
    }
    if (error == 0) return node_link(fd, name.empty() ? to.text() : name);
    ::close(fd);
    why = errno_text(error);
  }
  throw tool_error("cannot reach the agent at " + to.text() + ": " + why +
                   " (is `cuda-ckpt job-agent` running there, listening at that address?)");
}

void node_link::send(const nlohmann::json& message, deadline until) {
  const std::string line = message.dump() + "\n";
  std::size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd_, POLLOUT, until)) continue;
    throw tool_error("lost the connection to " + peer_ + ": " +
                     (n < 0 && errno != EAGAIN ? errno_text(errno) : "it does not read (deadline passed)"));
  }
}

nlohmann::json node_link::receive(deadline until) {
  for (;;) {
    const auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      const std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      nlohmann::json message;
      try {
        message = json_fields::parse_limited(line, 8);
      } catch (const std::exception&) {
        message = nullptr;
      }
      if (!message.is_object()) throw tool_error(peer_ + " sent something that is no message of cuda-ckpt's");
      if (message.contains("error") && message["error"].is_string())
        throw tool_error(peer_ + ": " + message["error"].get<std::string>());
      return message;
    }
    if (buffer_.size() > max_line) throw tool_error(peer_ + " sent a line longer than 1 MiB");
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n > 0) {
      buffer_.append(chunk, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) throw tool_error(peer_ + " closed the connection (it exited or gave up)");
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd_, POLLIN, until)) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      throw tool_error(peer_ + " did not answer in time (the deadline passed)");
    throw tool_error("lost the connection to " + peer_ + ": " + errno_text(errno));
  }
}

nlohmann::json node_link::expect(const std::string& step, deadline until) {
  nlohmann::json message = receive(until);
  if (message.value("step", std::string()) != step)
    throw tool_error(peer_ + " answered out of turn (expected \"" + step + "\"): it runs another cuda-ckpt version?");
  return message;
}

void node_link::wait_closed(deadline until) noexcept {
  ::shutdown(fd_, SHUT_WR);
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    if (n < 0 && errno == EAGAIN && wait_for(fd_, POLLIN, until)) continue;
    return;
  }
}

int node_link::release(std::string& unread) {
  unread = std::move(buffer_);
  buffer_.clear();
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

int listen_tcp(const node_address& at, std::string& bound) {
  const auto found = resolve(at, true);
  std::string why = "no address";
  for (const addrinfo* ai = found.get(); ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
      bound = peer_name(local);
      return fd;
    }
    why = errno_text(errno);
    ::close(fd);
  }
  throw tool_error("cannot listen at " + at.text() + ": " + why);
}

}  // namespace vmmckpt::ckpt
