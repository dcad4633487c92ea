// cuda-ckpt's CUDA driver, loaded at run time by the commands that touch a GPU: the tool links no libcuda.
#pragma once

#include <string>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/support/driver_api.hpp"

namespace vmmckpt::ckpt {

// The driver cannot be loaded here, or lacks an entry point the tool needs. what() says which
// library and why; the command line adds which command needed it.
struct driver_unavailable : tool_error {
  using tool_error::tool_error;
};

// The library loaded: $VMMCKPT_LIBCUDA when set, else libcuda.so.1 found the usual way.
std::string driver_library_name();

// The driver's table, loaded on first use (once; a failure is remembered and thrown again).
// Throws driver_unavailable. A command that needs a GPU calls this before it touches a process.
const driver_api& driver();

}  // namespace vmmckpt::ckpt
