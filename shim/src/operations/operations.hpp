// In-process operations: what cuda-ckpt and the program itself ask of the process (a hold for a dump or a
// suspend, a resume, a pause, a restore), one at a time under one lock, and the one state they leave it in.
// The control server (control_server.cpp) only carries the requests here and the replies back.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::detail {

// Where the process stands. Changed only under operation_lock(), or by the restore at start before any
// other thread can reach the process; read by anyone.
enum class process_state {
  running,    // the program runs, its memory its own
  holding,    // held for a dump or a suspend: the gate closed, the memory handed to cuda-ckpt
  suspended,  // its GPU memory given back after a suspend; CUDA calls wait for resume
  paused,     // its GPU memory given back by the program itself (vmmckpt_pause)
  restoring,  // its memory coming back from an image (resume, or a restore at start)
};
process_state current_state() noexcept;
void enter_state(process_state next) noexcept;
const char* name_of(process_state s) noexcept;

// Taken by each operation that changes the program's memory, one at a time.
std::timed_mutex& operation_lock();

// The connection a request came on (control_server.cpp): operations say what to answer, the server how.
class client_channel {
 public:
  virtual ~client_channel() = default;
  // One reply frame with its descriptors; false when it could not be sent (the client is gone).
  virtual bool send(const std::string& payload, const std::vector<int>& fds = {}) = 0;
  // A frame that may be dropped: given only `wait` to leave, and none follows one that could not.
  virtual bool send_within(const std::string& payload, std::chrono::milliseconds wait) = 0;
  // The client's next frame within `wait`; false, with why in `error`, when none came.
  virtual bool receive(std::string& payload, std::vector<int>& fds, std::chrono::milliseconds wait,
                       protocol::failure& error) = 0;
  // The process at the other end; 0 when the kernel does not say.
  virtual pid_t peer_pid() = 0;
  // Whether the client sent something (or went away) within `wait`.
  virtual bool readable(std::chrono::milliseconds wait) = 0;
};

// Sends a refusal; false when it could not be sent.
bool refuse(client_channel& client, control::refusal code, const std::string& why);
// The operation lock, waited for until the request is void (valid_until_ms); false, and a reply saying so, when
// another operation kept it that long.
bool take_operation(client_channel& client, std::unique_lock<std::timed_mutex>& lock, std::int64_t valid_until_ms);

// Answers one request, with the descriptors it carried (the caller closes them); false when the connection
// is to be closed.
bool answer(client_channel& client, const control::request& request, const std::vector<int>& fds);

}  // namespace vmmckpt::detail
