// One connection to a process under the shim, for one operation: its hello, and this tool's CUDA view of its devices.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <vector>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::ckpt {

// What an image says of when and where it was written: the time now (ISO 8601, UTC), and this host's name.
std::string now_iso8601();
std::string hostname();

class session {
 public:
  enum class expect { running, suspended };
  // Connects and says hello, all by `until` (the operation's own: connecting and the first
  // exchange count against it too); a tool_error when the process speaks another protocol version or is
  // not in the state the operation needs (`what` names the operation in that message).
  session(pid_t pid, expect state, const char* what, deadline until);

  control_client& client() { return client_; }
  pid_t pid() const { return client_.pid(); }
  const control::hello_reply& hello() const { return hello_; }
  // The manifest's account of the process: tool version, time, host, pid, command line.
  void describe_process(image::manifest& m) const;
  // Live bytes in the program's pools at hello: what staging is sized for.
  std::uint64_t live_bytes() const;

  // cuInit, then the primary context of the device of the program's first pool, current on the
  // calling thread (and returned): the context everything of this session runs in. A tool_error
  // when the program has no pool yet.
  CUcontext open_context();
  // This tool's device for the program's device `d`: the one with its UUID (ordinals differ when
  // CUDA_VISIBLE_DEVICES does), else the same ordinal.
  CUdevice device_for(const device_description& d);
  // The description of the program's device `ordinal` in `known`, or one with the ordinal alone.
  static device_description describe(int ordinal, const std::vector<device_description>& known);

 private:
  control_client client_;
  control::hello_reply hello_;
  std::map<int, CUdevice> devices_;  // the program's ordinal -> ours
};

// The memory of this hold that the image records without holding its bytes: `lacking` (device memory the
// shim does not own; when there is some and `allow_partial` is false, throws partial_refused, and closing
// the connection then releases the program) and `ipc_imports` (other processes' memory, mapped here through
// CUDA IPC: recorded, never refused).
void record_memory_not_held(const session& s, const control::dump_begin_reply& held, bool allow_partial,
                            image::manifest& m);

// What is left of the operation's deadline for holding the program; a tool_error when preparing
// took (almost) all of it, so that the program is not held for a hold that cannot succeed.
std::chrono::milliseconds hold_budget(session& s, std::chrono::milliseconds hold_deadline);

}  // namespace vmmckpt::ckpt
