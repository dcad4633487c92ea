// One request from this process's shim to another process's control server and its reply: how legacy IPC
// imports and VMM imports reach the process whose memory they map (docs/ipc.md, docs/vmm.md).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::detail {

// Sends `request` (with `send_fds`, which stay the caller's) to process `pid` and returns the reply's
// payload, with the descriptors it carried in `fds`. Nothing when the process cannot be reached or does
// not answer within timeout_ms; `gone` then says whether it has no control server any more. The server
// must be that very process, run by this user or root.
std::optional<std::string> ask_process(pid_t pid, const control::request& request, const std::vector<int>& send_fds,
                                       int timeout_ms, std::vector<int>& fds, bool& gone);

}  // namespace vmmckpt::detail
