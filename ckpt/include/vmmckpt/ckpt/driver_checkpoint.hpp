// The driver's process checkpoint API (cuCheckpointProcess*) for one process, with errors in words.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <string>

namespace vmmckpt::ckpt {

// The loaded driver has the API (driver 550 and later); otherwise a message saying so. Loads the driver.
std::string driver_checkpoint_missing();

std::string process_state_name(CUprocessState state);

// Each throws tool_error naming the call, the process and the driver's error.
CUprocessState driver_process_state(pid_t pid);
void driver_lock(pid_t pid, unsigned timeout_ms);
void driver_checkpoint(pid_t pid);
void driver_restore(pid_t pid);
void driver_unlock(pid_t pid);

// For `cuda-ckpt resume PID` after a whole-process dump was stopped midway: a process the driver left
// CHECKPOINTED is restored and unlocked, one left LOCKED unlocked. Returns what was done in words, or
// "" when the process was RUNNING for the driver (or the driver or its API is not there).
std::string recover_driver_state(pid_t pid);

}  // namespace vmmckpt::ckpt
