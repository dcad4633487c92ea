// One request to another process under the shim, checked to reach that process.
#include "memory/peer_requests.hpp"

#include <unistd.h>

#include <algorithm>

#include "vmmckpt/support/log.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::detail {
namespace {
constexpr int connect_timeout_ms = 5'000;
}  // namespace

std::optional<std::string> ask_process(pid_t pid, const control::request& request, const std::vector<int>& send_fds,
                                       int timeout_ms, std::vector<int>& fds, bool& gone) {
  gone = false;
  protocol::failure error;
  const int fd = protocol::connect_to(protocol::abstract_address(pid), std::min(timeout_ms, connect_timeout_ms), error);
  if (fd < 0) {
    gone = error.kind == protocol::failure_kind::no_socket || error.kind == protocol::failure_kind::connection_refused;
    log::info("cannot reach process {}: {}", pid, error.text);
    return std::nullopt;
  }
  uid_t uid = 0;
  pid_t server = 0;
  std::string payload;
  // Anyone may bind an abstract name first: the server must be the process asked for.
  const bool ok = protocol::peer_credentials(fd, uid, server) && server == pid && (uid == ::geteuid() || uid == 0) &&
                  protocol::send_frame(fd, control::encode(request), send_fds, timeout_ms, error) &&
                  protocol::recv_frame(fd, payload, fds, timeout_ms, error);
  ::close(fd);
  if (!ok) {
    log::info("process {} did not answer: {}", pid, error.text.empty() ? "not the process asked for" : error.text);
    return std::nullopt;
  }
  return payload;
}

}  // namespace vmmckpt::detail
