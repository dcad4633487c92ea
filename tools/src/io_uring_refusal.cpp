// `cuda-ckpt run`: a seccomp filter answering io_uring_setup with ENOSYS.
#include "io_uring_refusal.hpp"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace vmmckpt::tools {
namespace {

#if defined(__x86_64__)
constexpr unsigned this_arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr unsigned this_arch = AUDIT_ARCH_AARCH64;
#else
constexpr unsigned this_arch = 0;  // no filter: the architecture's numbers are not known here
#endif

int install(const sock_fprog& program) { return ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0); }

}  // namespace

std::string refuse_io_uring() {
  if (const char* allow = std::getenv("VMMCKPT_ALLOW_IO_URING"); allow != nullptr && std::strcmp(allow, "1") == 0)
    return {};
  if (this_arch == 0) return "io_uring is left to the command on this architecture";
  // Another architecture's system calls (a 32-bit program) pass: their numbers differ.
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, this_arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  const sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  if (install(program) == 0) return {};
  if (errno == EACCES && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && install(program) == 0) return {};
  return std::string("io_uring is left to the command (seccomp: ") + std::strerror(errno) + ")";
}

}  // namespace vmmckpt::tools
