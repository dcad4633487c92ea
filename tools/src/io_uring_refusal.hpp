// `cuda-ckpt run`: io_uring refused to the command, so that CRIU can checkpoint it whole.
#pragma once

#include <string>

namespace vmmckpt::tools {

// Makes io_uring_setup fail with ENOSYS in this process and in everything it executes from now on (a seccomp
// filter, which CRIU dumps and restores with the process). CRIU cannot dump an io_uring instance, and libuv (PyTorch's
// TCPStore, which torchrun hosts) sets one up even with UV_USE_IO_URING=0; refused, it falls back to epoll.
// Without CAP_SYS_ADMIN the filter needs no_new_privs, which is set too: setuid programs the command starts then run
// without their privileges. VMMCKPT_ALLOW_IO_URING=1 leaves io_uring alone. Returns why it could not be done, or "".
std::string refuse_io_uring();

}  // namespace vmmckpt::tools
