// The control server: a thread in the program that answers cuda-ckpt over a Unix socket (docs/protocol.md).
#pragma once

#include <mutex>

namespace vmmckpt::detail {

// Starts the server once, on the process's first CUDA use. Failure is logged
// and leaves the program running without it.
void start_control_server() noexcept;

// Taken by each operation that changes the program's memory (a dump or suspend, a resume, the program's own
// vmmckpt_pause and vmmckpt_resume), one at a time.
std::timed_mutex& operation_lock();

}  // namespace vmmckpt::detail
