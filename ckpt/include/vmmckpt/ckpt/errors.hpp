// What the tool's operations throw, in one place: every floor of ckpt/ throws them and the commands turn each into
// its message and exit code (tools/src/exit_codes.hpp).
#pragma once

#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::ckpt {

// A failure the user can act on; the message says what happened and what to do.
struct tool_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A request that did not succeed: either the channel failed (`channel` says how; the process may
// or may not have acted on the request) or the process refused it (`refused`, with its reason).
struct control_error : tool_error {
  control_error(const std::string& what, protocol::failure_kind channel_kind)
      : tool_error(what), channel(channel_kind) {}
  control_error(const std::string& what, control::refusal reason) : tool_error(what), refused(true), refusal(reason) {}
  protocol::failure_kind channel = protocol::failure_kind::none;
  bool refused = false;
  control::refusal refusal = control::refusal::failed;
};

// No process of that pid, or one that has exited.
struct no_such_process : tool_error {
  using tool_error::tool_error;
};

// The process does not run under the shim: nothing of vmmckpt's can reach it.
struct not_under_vmmckpt : tool_error {
  using tool_error::tool_error;
};

// The shim is loaded in the process but no control server listens for it: it has made no CUDA call
// yet, or it is a child made by fork() (the server is its parent's).
struct no_control_server : tool_error {
  using tool_error::tool_error;
};

// dump or suspend refused because the program has device memory vmmckpt does not own, which the
// image would lack, and a partial image was not allowed. Nothing was written and the program goes
// on. The command line words the advice (its --allow-partial) and the sizes.
struct partial_refused : tool_error {
  partial_refused(const std::string& what, pid_t process, std::vector<control::not_owned_memory> memory)
      : tool_error(what), pid(process), not_owned(std::move(memory)) {}
  pid_t pid = 0;
  std::vector<control::not_owned_memory> not_owned;
};

// The driver cannot be loaded here, or lacks an entry point the tool needs. what() says which
// library and why; the command line adds which command needed it.
struct driver_unavailable : tool_error {
  using tool_error::tool_error;
};

// CRIU cannot be used here: what() says why and what to install.
struct criu_unavailable : tool_error {
  using tool_error::tool_error;
};

// A rank of a job's operation gave up because another did: the other's own error says why.
struct other_rank_failed : tool_error {
  using tool_error::tool_error;
};

// The operation stopped at the signal `signal` (SIGINT, SIGTERM) that copy_settings::interrupt reported:
// nothing was written, and the program was released unharmed by the time this reaches the caller.
struct interrupted : std::runtime_error {
  interrupted(const std::string& what, int sig) : std::runtime_error(what), signal(sig) {}
  int signal = 0;
};

}  // namespace vmmckpt::ckpt
