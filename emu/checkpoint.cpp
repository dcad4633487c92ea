// The driver's process checkpoint API (cuCheckpointProcess*), emulated as its state machine.
//
// As in the real driver, a process's state lives in that process (here: one variable of this
// library), so CRIU dumps and restores it with the process. Another process (cuda-ckpt) reads and
// writes it with process_vm_readv/writev, at the variable's offset in this same library mapped there
// (the permission is ptrace's, as CRIU's is). RUNNING -> LOCKED -> CHECKPOINTED -> LOCKED -> RUNNING;
// any other move is CUDA_ERROR_ILLEGAL_STATE. Nothing else changes with the state: there are no device
// files to close, and the programs vmmckpt checkpoints are held by its own gate meanwhile.
// VMMCKPT_EMU_NO_CHECKPOINT_API=1 makes every call answer not supported, as a driver older than 550.
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "config.hpp"
#include "emu_api.hpp"

namespace {

// This process's state, as another process's cuda-ckpt sees it through process_vm_readv.
volatile int g_process_state = CU_PROCESS_STATE_RUNNING;

bool api_disabled() {
  static const bool disabled = [] {
    const char* v = std::getenv("VMMCKPT_EMU_NO_CHECKPOINT_API");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return disabled;
}

// Where g_process_state is in process `pid`: this library's load address there plus the variable's
// offset here. 0 when pid has no such mapping (no such process, or one without the emulator).
unsigned long state_address(int pid) {
  Dl_info info{};
  if (::dladdr(const_cast<int*>(&g_process_state), &info) == 0 || info.dli_fname == nullptr) return 0;
  struct stat self {};
  if (::stat(info.dli_fname, &self) != 0) return 0;
  const unsigned long offset =
      reinterpret_cast<unsigned long>(&g_process_state) - reinterpret_cast<unsigned long>(info.dli_fbase);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE* maps = std::fopen(path, "re");
  if (maps == nullptr) return 0;
  unsigned long base = 0;
  char line[4096];
  while (base == 0 && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long start = 0, end = 0, file_offset = 0, inode = 0;
    unsigned dev_major = 0, dev_minor = 0;
    if (std::sscanf(line, "%lx-%lx %*4s %lx %x:%x %lu", &start, &end, &file_offset, &dev_major, &dev_minor, &inode) !=
        6)
      continue;
    if (file_offset == 0 && inode == self.st_ino && makedev(dev_major, dev_minor) == self.st_dev) base = start;
  }
  std::fclose(maps);
  return base == 0 ? 0 : base + offset;
}

// Reads (or with `write`, writes) process pid's state: this process's own variable, or another's through
// process_vm_readv/writev.
CUresult access_state(int pid, int& state, bool write) {
  if (pid == ::getpid()) {
    if (write)
      g_process_state = state;
    else
      state = g_process_state;
    return CUDA_SUCCESS;
  }
  const unsigned long at = state_address(pid);
  if (at == 0) return CUDA_ERROR_INVALID_VALUE;
  iovec local{&state, sizeof state}, remote{reinterpret_cast<void*>(at), sizeof state};
  const ssize_t n =
      write ? ::process_vm_writev(pid, &local, 1, &remote, 1, 0) : ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  return n == sizeof state ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// One move of the state machine: from `from` to `to`, or ILLEGAL_STATE.
CUresult move(const char* what, int pid, CUprocessState from, CUprocessState to) {
  if (api_disabled()) {
    vmmckpt::emu::trace("%s: the driver checkpoint API is switched off (VMMCKPT_EMU_NO_CHECKPOINT_API)", what);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  int state = 0;
  if (const CUresult r = access_state(pid, state, false); r != CUDA_SUCCESS) return r;
  if (state != from) return CUDA_ERROR_ILLEGAL_STATE;
  state = to;
  return access_state(pid, state, true);
}

}  // namespace

extern "C" {

CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  if (api_disabled()) return CUDA_ERROR_NOT_SUPPORTED;
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int s = 0;
  if (const CUresult r = access_state(pid, s, false); r != CUDA_SUCCESS) return r;
  *state = static_cast<CUprocessState>(s);
  return CUDA_SUCCESS;
}
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs*) {
  return move("cuCheckpointProcessLock", pid, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED);
}
CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs*) {
  return move("cuCheckpointProcessCheckpoint", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED);
}
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs*) {
  return move("cuCheckpointProcessRestore", pid, CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED);
}
CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs*) {
  return move("cuCheckpointProcessUnlock", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING);
}
CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  if (api_disabled()) return CUDA_ERROR_NOT_SUPPORTED;
  if (tid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int s = 0;
  if (const CUresult r = access_state(pid, s, false); r != CUDA_SUCCESS) return r;
  *tid = pid;  // the emulator has no restore thread of its own: the process's main thread stands for it
  return CUDA_SUCCESS;
}

}  // extern "C"
