// The one error idiom of code that runs inside the program (the shim, the restore engine): a CUDA result and what failed.
//
// Nothing inside the program throws across a function of ours: a step that fails returns a failed
// status, built with failure() (which logs it once), and every caller that passes it on does so
// through VMMCKPT_TRY, which adds one log line naming where it passed, so the log reads like a
// stack trace (NCCL's habit). Exported entry points hand status::code() to the program; the
// control server hands message() to cuda-ckpt.
#pragma once

#include <cuda.h>

#include <string>
#include <utility>

#include "vmmckpt/support/log.hpp"

namespace vmmckpt {

class [[nodiscard]] status {
 public:
  status() noexcept = default;  // success
  status(CUresult code, std::string message) noexcept : code_(code), message_(std::move(message)) {}
  bool ok() const noexcept { return code_ == CUDA_SUCCESS; }
  CUresult code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

 private:
  CUresult code_ = CUDA_SUCCESS;
  std::string message_;
};

// A failed status saying why (formatted like the log), logged once at warn where it arises.
template <typename... Args>
status failure(CUresult code, fmt::format_string<Args...> format, Args&&... args) noexcept {
  std::string message;
  try {
    message = fmt::format(format, std::forward<Args>(args)...);
  } catch (...) {
    message = "out of memory";  // short enough to need no allocation
  }
  log::warn("{}", message);
  return status(code == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : code, std::move(message));
}

}  // namespace vmmckpt

// Returns a failed status to the caller, noting where it passed.
#define VMMCKPT_TRY(expr)                                                           \
  do {                                                                              \
    ::vmmckpt::status vmmckpt_status_ = (expr);                                     \
    if (!vmmckpt_status_.ok()) {                                                    \
      ::vmmckpt::log::info("  passed on at {}:{} ({})", __FILE__, __LINE__, #expr); \
      return vmmckpt_status_;                                                       \
    }                                                                               \
  } while (0)
