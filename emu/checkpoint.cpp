// The driver's process checkpoint API (cuCheckpointProcess*): not available on the emulator, so
// callers (cuda-ckpt) take their "driver checkpoint not supported" path, as on an older driver.
#include "config.hpp"
#include "emu_api.hpp"

namespace {

CUresult not_supported(const char* what) {
  vmmckpt::emu::trace("%s: the driver checkpoint API is not supported by the emulator", what);
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

extern "C" {

CUresult cuCheckpointProcessGetRestoreThreadId(int, int*) { return not_supported("cuCheckpointProcessGetRestoreThreadId"); }
CUresult cuCheckpointProcessGetState(int, CUprocessState*) { return not_supported("cuCheckpointProcessGetState"); }
CUresult cuCheckpointProcessLock(int, CUcheckpointLockArgs*) { return not_supported("cuCheckpointProcessLock"); }
CUresult cuCheckpointProcessCheckpoint(int, CUcheckpointCheckpointArgs*) { return not_supported("cuCheckpointProcessCheckpoint"); }
CUresult cuCheckpointProcessRestore(int, CUcheckpointRestoreArgs*) { return not_supported("cuCheckpointProcessRestore"); }
CUresult cuCheckpointProcessUnlock(int, CUcheckpointUnlockArgs*) { return not_supported("cuCheckpointProcessUnlock"); }

}  // extern "C"
