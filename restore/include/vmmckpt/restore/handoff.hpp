// The hand-off from `cuda-ckpt restore` to the shim in the process it starts: which image, how, and for which process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace vmmckpt::restore {

enum class mode {
  live,    // the image's allocations are live in the new process: pointers it kept stay valid
  replay,  // the allocator starts empty with the bytes in place, for a program that repeats its allocations
};

struct handoff {
  std::string image;  // absolute path of the image directory
  mode how = mode::live;
  pid_t pid = 0;  // the process meant: exec keeps the pid, and children that inherit the environment are not it
  // Device 0's pool base and each pool's size, as in the image; 0 when it has no pool (not exported).
  std::uint64_t pool_base = 0, pool_size = 0;
  // Device 0's VMM window and each window's size, as in the image; 0 when it has no VMM memory (not exported).
  std::uint64_t vmm_base = 0, vmm_window = 0;
  // A socket (SOCK_SEQPACKET) on which the shim sends a control::progress_frame as the image loads,
  // and which it closes once loaded or failed: cuda-ckpt's progress line. -1: none.
  int progress_fd = -1;
  std::uint64_t progress_inode = 0;  // that socket's inode: a descriptor the program reused is not it
};

// Puts the hand-off into this process's environment, for the command it is about to exec: the
// variables the shim reads, including the pool layout (VMMCKPT_POOL_BASE and VMMCKPT_POOL_SIZE) and the
// VMM windows (VMMCKPT_VMM_BASE and VMMCKPT_VMM_WINDOW).
void export_to_environment(const handoff& h);

// The hand-off meant for the calling process (`self`), read from its environment: nothing when
// there is none, or when it is meant for another process. Never throws (a path it has no memory to
// copy comes back empty, and the restore of an empty path fails).
std::optional<handoff> handoff_for(pid_t self) noexcept;

}  // namespace vmmckpt::restore
