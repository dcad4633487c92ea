// CUDA driver calls in the tools: a failure becomes a tool_error naming the call, file:line and the error.
#pragma once

#include <cuda.h>

#include <string>

#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt::detail {

[[noreturn]] inline void throw_cuda_error(CUresult e, const char* call, const char* file, int line) {
  const char* name = nullptr;
  const char* text = nullptr;
  // A call failed, so the driver is loaded: driver() does not throw here.
  driver().cuGetErrorName(e, &name);
  driver().cuGetErrorString(e, &text);
  throw tool_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                   (name ? name : "CUDA error " + std::to_string(e)) + (text ? std::string(" (") + text + ")" : ""));
}

}  // namespace vmmckpt::ckpt::detail

#define VMMCKPT_CUDA_TRY(call)                                                               \
  do {                                                                                       \
    const CUresult vmmckpt_result_ = (call);                                                 \
    if (vmmckpt_result_ != CUDA_SUCCESS)                                                     \
      ::vmmckpt::ckpt::detail::throw_cuda_error(vmmckpt_result_, #call, __FILE__, __LINE__); \
  } while (0)
