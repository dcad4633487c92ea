// The hand-off between `cuda-ckpt restore` and the shim: environment variables, named here only.
#include "vmmckpt/restore/handoff.hpp"

#include <cstdlib>
#include <string_view>

#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::restore {
namespace {

constexpr const char* env_image = "VMMCKPT_RESTORE_IMAGE";
constexpr const char* env_mode = "VMMCKPT_RESTORE_MODE";
constexpr const char* env_pid = "VMMCKPT_RESTORE_PID";
constexpr const char* env_progress_fd = "VMMCKPT_RESTORE_PROGRESS_FD";
constexpr const char* env_progress_inode = "VMMCKPT_RESTORE_PROGRESS_INODE";

}  // namespace

void export_to_environment(const handoff& h) {
  ::setenv(env_image, h.image.c_str(), 1);
  ::setenv(env_mode, h.how == mode::replay ? "replay" : "live", 1);
  ::setenv(env_pid, std::to_string(h.pid).c_str(), 1);
  if (h.progress_fd >= 0) {
    ::setenv(env_progress_fd, std::to_string(h.progress_fd).c_str(), 1);
    ::setenv(env_progress_inode, std::to_string(h.progress_inode).c_str(), 1);
  } else {
    ::unsetenv(env_progress_fd);
    ::unsetenv(env_progress_inode);
  }
  if (h.pool_size != 0) {
    ::setenv(env_pool_base, std::to_string(h.pool_base).c_str(), 1);
    ::setenv(env_pool_size, std::to_string(h.pool_size).c_str(), 1);
  }
  if (h.vmm_window != 0) {
    ::setenv(env_vmm_base, std::to_string(h.vmm_base).c_str(), 1);
    ::setenv(env_vmm_window, std::to_string(h.vmm_window).c_str(), 1);
  }
}

std::optional<handoff> handoff_for(pid_t self) noexcept {
  const char* image = std::getenv(env_image);
  const char* pid = std::getenv(env_pid);
  if (image == nullptr || *image == '\0' || pid == nullptr || std::atol(pid) != static_cast<long>(self))
    return std::nullopt;
  handoff h;
  h.pid = self;
  const char* how = std::getenv(env_mode);
  h.how = how != nullptr && std::string_view(how) == "replay" ? mode::replay : mode::live;
  if (const char* fd = std::getenv(env_progress_fd); fd != nullptr && *fd >= '0' && *fd <= '9')
    h.progress_fd = static_cast<int>(std::atol(fd));
  if (const char* inode = std::getenv(env_progress_inode); inode != nullptr)
    h.progress_inode = std::strtoull(inode, nullptr, 10);
  try {
    h.image = image;
  } catch (...) {
    // Left empty: the restore then fails, as it must, rather than the process starting without it.
  }
  // The pool layout and VMM windows travel as their own variables; the shim reads them as for any process.
  return h;
}

}  // namespace vmmckpt::restore
