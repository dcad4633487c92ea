// One request to another process under the shim, checked to reach that process.
#include "memory/peer_requests.hpp"

#include <unistd.h>

#include <algorithm>

#include "vmmckpt/support/log.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::detail {
namespace {
constexpr int connect_timeout_ms = 5'000;

// A connection to pid's own control server under one of its abstract names; -1 when none is it. `gone`: no
// name had anybody listening.
int connect_to_process(pid_t pid, int timeout_ms, bool& gone) {
  gone = true;
  for (const std::string& address : protocol::abstract_addresses(pid)) {
    protocol::failure error;
    const int fd = protocol::connect_to(address, std::min(timeout_ms, connect_timeout_ms), error);
    if (fd < 0) {
      if (error.kind != protocol::failure_kind::no_socket && error.kind != protocol::failure_kind::connection_refused)
        gone = false;
      log::info("cannot reach process {}: {}", pid, error.text);
      continue;
    }
    gone = false;
    // Anyone may bind an abstract name first: the server must be the process asked for, before anything is sent.
    uid_t uid = 0;
    pid_t server = 0;
    if (protocol::peer_credentials(fd, uid, server) && server == pid && (uid == ::geteuid() || uid == 0)) return fd;
    log::info("process {}: {} is served by process {} (uid {}), not by it", pid, protocol::printable_address(address),
              server, uid);
    ::close(fd);
  }
  return -1;
}

}  // namespace

std::optional<std::string> ask_process(pid_t pid, const control::request& request, const std::vector<int>& send_fds,
                                       int timeout_ms, std::vector<int>& fds, bool& gone) {
  const int fd = connect_to_process(pid, timeout_ms, gone);
  if (fd < 0) return std::nullopt;
  protocol::failure error;
  std::string payload;
  const bool ok = protocol::send_frame(fd, control::encode(request), send_fds, timeout_ms, error) &&
                  protocol::recv_frame(fd, payload, fds, timeout_ms, error);
  ::close(fd);
  if (!ok) {
    log::info("process {} did not answer: {}", pid, error.text);
    return std::nullopt;
  }
  return payload;
}

}  // namespace vmmckpt::detail
