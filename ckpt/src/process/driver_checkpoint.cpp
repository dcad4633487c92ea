// The driver's process checkpoint API for one process: each call, its failure said with the process and the error.
#include "vmmckpt/ckpt/driver_checkpoint.hpp"

#include <unistd.h>

#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {
namespace {

void check(CUresult r, const char* call, pid_t pid) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (driver().cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) name = "an unknown error";
  throw tool_error(std::string(call) + " of process " + std::to_string(pid) + " failed: " + name +
                   (r == CUDA_ERROR_NOT_SUPPORTED ? " (this driver or GPU does not support process checkpoints)" : ""));
}

}  // namespace

std::string driver_checkpoint_missing() {
  const driver_api& d = driver();
  if (!d.cuCheckpointProcessGetState || !d.cuCheckpointProcessLock || !d.cuCheckpointProcessCheckpoint ||
      !d.cuCheckpointProcessRestore || !d.cuCheckpointProcessUnlock)
    return "the CUDA driver (" + driver_library_name() +
           ") lacks the process checkpoint API (cuCheckpointProcess*, driver 550 or later; 570 or later recommended)";
  // Present but switched off for this system or GPU: it says so for any CUDA process, this one included
  // (initialized first: the question is then about a CUDA process).
  CUprocessState state{};
  if (d.cuInit(0) == CUDA_SUCCESS && d.cuCheckpointProcessGetState(::getpid(), &state) == CUDA_ERROR_NOT_SUPPORTED)
    return "the CUDA driver (" + driver_library_name() + ") does not support process checkpoints here";
  return {};
}

std::string process_state_name(CUprocessState state) {
  switch (state) {
    case CU_PROCESS_STATE_RUNNING: return "RUNNING";
    case CU_PROCESS_STATE_LOCKED: return "LOCKED";
    case CU_PROCESS_STATE_CHECKPOINTED: return "CHECKPOINTED";
    case CU_PROCESS_STATE_FAILED: return "FAILED";
  }
  return "state " + std::to_string(static_cast<int>(state));
}

CUprocessState driver_process_state(pid_t pid) {
  CUprocessState state = CU_PROCESS_STATE_RUNNING;
  check(driver().cuCheckpointProcessGetState(pid, &state), "cuCheckpointProcessGetState", pid);
  return state;
}

void driver_lock(pid_t pid, unsigned timeout_ms) {
  CUcheckpointLockArgs args{};
  args.timeoutMs = timeout_ms;
  check(driver().cuCheckpointProcessLock(pid, &args), "cuCheckpointProcessLock", pid);
}

void driver_checkpoint(pid_t pid) {
  CUcheckpointCheckpointArgs args{};
  check(driver().cuCheckpointProcessCheckpoint(pid, &args), "cuCheckpointProcessCheckpoint", pid);
}

void driver_restore(pid_t pid) {
  CUcheckpointRestoreArgs args{};
  check(driver().cuCheckpointProcessRestore(pid, &args), "cuCheckpointProcessRestore", pid);
}

void driver_unlock(pid_t pid) {
  CUcheckpointUnlockArgs args{};
  check(driver().cuCheckpointProcessUnlock(pid, &args), "cuCheckpointProcessUnlock", pid);
}

std::string recover_driver_state(pid_t pid) {
  try {
    if (!driver_checkpoint_missing().empty()) return {};
  } catch (const driver_unavailable&) {
    return {};  // no driver here: nothing of the driver's to recover
  }
  CUprocessState state = CU_PROCESS_STATE_RUNNING;
  if (driver().cuCheckpointProcessGetState(pid, &state) != CUDA_SUCCESS) return {};
  if (state == CU_PROCESS_STATE_CHECKPOINTED) {
    driver_restore(pid);
    driver_unlock(pid);
    return "the driver had its CUDA context checkpointed (a whole-process dump stopped midway): restored and unlocked";
  }
  if (state == CU_PROCESS_STATE_LOCKED) {
    driver_unlock(pid);
    return "the driver had it locked (a whole-process dump stopped midway): unlocked";
  }
  if (state == CU_PROCESS_STATE_FAILED)
    throw tool_error("the driver reports process " + std::to_string(pid) +
                     " FAILED (an uncorrectable error during a checkpoint or restore): it cannot be recovered");
  return {};
}

}  // namespace vmmckpt::ckpt
