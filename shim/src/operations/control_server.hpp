// The control server: a thread in the program that answers cuda-ckpt over a Unix socket (docs/protocol.md).
#pragma once

namespace vmmckpt::detail {

// Starts the server once (startup.cpp: on the first memory the shim serves). Failure is logged and leaves
// the program running without it.
void start_control_server() noexcept;

}  // namespace vmmckpt::detail
