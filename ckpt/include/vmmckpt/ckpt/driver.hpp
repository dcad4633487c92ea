// cuda-ckpt's CUDA driver, loaded at run time by the commands that touch a GPU: the tool links no libcuda.
#pragma once

#include <string>

#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/driver_api.hpp"

namespace vmmckpt::ckpt {

// The library loaded: $VMMCKPT_LIBCUDA when set, else libcuda.so.1 found the usual way.
std::string driver_library_name();

// The driver's table, loaded on first use (once; a failure is remembered and thrown again).
// Throws driver_unavailable. A command that needs a GPU calls this before it touches a process.
const driver_api& driver();

}  // namespace vmmckpt::ckpt
