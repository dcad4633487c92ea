// The link between a job's coordinator and the agent of each of its nodes (docs/job-checkpoint.md, "Across
// nodes"): TCP, one JSON object per line, every connection opened with the job's shared secret.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include "vmmckpt/ckpt/deadlines.hpp"

namespace vmmckpt::ckpt {

// HOST:PORT ([V6ADDR]:PORT for IPv6); tool_error when the text is not that.
struct node_address {
  std::string host;
  std::string port;
  std::string text() const;
};
node_address parse_node_address(const std::string& text);

// Whether two secrets are the same, in a time that does not tell how much of them matched.
bool same_token(const std::string& a, const std::string& b) noexcept;

class node_link {
 public:
  using clock = std::chrono::steady_clock;

  // Takes a connected TCP socket; `peer` names the other side in messages.
  node_link(int fd, std::string peer);
  // Connects by `until`; tool_error saying why not. `name`: the peer's in messages (default: the address).
  static node_link connect(const node_address& to, deadline until, const std::string& name = {});
  ~node_link();
  node_link(node_link&& other) noexcept;
  node_link& operator=(node_link&&) = delete;
  node_link(const node_link&) = delete;
  node_link& operator=(const node_link&) = delete;

  // tool_error when the message cannot be sent in time (the peer went away or stopped reading).
  void send(const nlohmann::json& message, deadline until);
  // The next message, one JSON object. tool_error when the connection ends, the deadline passes or the line is
  // no object of at most 1 MiB; a message {"error": TEXT} from the peer is thrown as tool_error naming the peer.
  nlohmann::json receive(deadline until);
  // receive(), which must answer `step` ({"step": STEP, ...}).
  nlohmann::json expect(const std::string& step, deadline until);
  // Says no more and waits until the peer closes its side (it has finished with what it was doing), or the
  // deadline passes; what it sends meanwhile is dropped.
  void wait_closed(deadline until) noexcept;
  // The socket, for the caller to carry on with as it is; bytes already read past the last line are handed over.
  int release(std::string& unread);

  const std::string& peer() const { return peer_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::string peer_;
  std::string buffer_;  // read past the last line returned
};

// An address as people read it: HOST:PORT, [V6ADDR]:PORT.
std::string peer_name(const sockaddr_storage& address);

// A listening TCP socket at `at` (port 0: a free one), close-on-exec; `bound` is set to where it listens.
int listen_tcp(const node_address& at, std::string& bound);

}  // namespace vmmckpt::ckpt
