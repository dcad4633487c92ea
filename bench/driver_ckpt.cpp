// The driver's own checkpoint of another process, as NVIDIA's cuda-checkpoint tool does it: the
// figure vmmckpt is compared with. Lock the process (its CUDA calls then block), checkpoint (its GPU
// memory moves to host memory and the GPU is freed), restore (back onto the GPU), unlock.
//
//   vmmckpt_bench_driver_ckpt PID [checkpoint | restore]
//
// With `checkpoint`, only lock and checkpoint (the process stays checkpointed, for CRIU to dump); with
// `restore`, only restore and unlock (a process CRIU brought back): the driver's half of a whole-process
// checkpoint (bench/run_bench.py's process part). The figures of the steps not taken are 0.
//
// Prints one JSON line: {"bench":"driver_ckpt","pid":..,"lock_s":..,"checkpoint_s":..,"restore_s":..,
// "unlock_s":..}. On a failed call it names the call and the error and exits 1, after unlocking the
// process when it was left locked, so that it does not stay frozen.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_util.hpp"

namespace {

const char* error_name(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return name != nullptr ? name : "?";
}

const char* state_name(CUprocessState s) {
  switch (s) {
    case CU_PROCESS_STATE_RUNNING: return "running";
    case CU_PROCESS_STATE_LOCKED: return "locked";
    case CU_PROCESS_STATE_CHECKPOINTED: return "checkpointed";
    case CU_PROCESS_STATE_FAILED: return "failed";
  }
  return "?";
}

[[noreturn]] void fail(int pid, const char* what, CUresult r) {
  CUprocessState state = CU_PROCESS_STATE_RUNNING;
  const bool known = cuCheckpointProcessGetState(pid, &state) == CUDA_SUCCESS;
  std::fprintf(stderr, "vmmckpt_bench_driver_ckpt: %s(%d) failed: %s (process state: %s)\n", what, pid, error_name(r),
               known ? state_name(state) : "unknown");
  if (known && state == CU_PROCESS_STATE_LOCKED) {
    CUcheckpointUnlockArgs unlock{};
    cuCheckpointProcessUnlock(pid, &unlock);
  }
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) bench::usage_error(argv[0], "usage: vmmckpt_bench_driver_ckpt PID [checkpoint|restore]");
  const std::string only = argc == 3 ? argv[2] : "";
  if (!only.empty() && only != "checkpoint" && only != "restore")
    bench::usage_error(argv[0], "the step is checkpoint or restore, not " + only);
  const int pid = std::atoi(argv[1]);
  if (pid <= 0) bench::usage_error(argv[0], std::string("not a process id: ") + argv[1]);
  // Restore needs cuInit in this process (or persistence mode).
  VMMCKPT_CHECK(cuInit(0));

  CUprocessState state = CU_PROCESS_STATE_RUNNING;
  if (const CUresult r = cuCheckpointProcessGetState(pid, &state); r != CUDA_SUCCESS)
    fail(pid, "cuCheckpointProcessGetState", r);
  const CUprocessState expected = only == "restore" ? CU_PROCESS_STATE_CHECKPOINTED : CU_PROCESS_STATE_RUNNING;
  if (state != expected) {
    std::fprintf(stderr, "vmmckpt_bench_driver_ckpt: process %d is %s, not %s\n", pid, state_name(state),
                 state_name(expected));
    return 1;
  }
  double lock_s = 0, checkpoint_s = 0, restore_s = 0, unlock_s = 0;
  if (only != "restore") {
    CUcheckpointLockArgs lock{};
    lock.timeoutMs = 0;  // wait as long as it takes: the caller's own timeout bounds the run
    auto t = bench::clock_type::now();
    if (const CUresult r = cuCheckpointProcessLock(pid, &lock); r != CUDA_SUCCESS)
      fail(pid, "cuCheckpointProcessLock", r);
    lock_s = bench::seconds_since(t);

    CUcheckpointCheckpointArgs checkpoint{};
    t = bench::clock_type::now();
    if (const CUresult r = cuCheckpointProcessCheckpoint(pid, &checkpoint); r != CUDA_SUCCESS)
      fail(pid, "cuCheckpointProcessCheckpoint", r);
    checkpoint_s = bench::seconds_since(t);
  }
  if (only != "checkpoint") {
    CUcheckpointRestoreArgs restore{};
    auto t = bench::clock_type::now();
    if (const CUresult r = cuCheckpointProcessRestore(pid, &restore); r != CUDA_SUCCESS)
      fail(pid, "cuCheckpointProcessRestore", r);
    restore_s = bench::seconds_since(t);

    CUcheckpointUnlockArgs unlock{};
    t = bench::clock_type::now();
    if (const CUresult r = cuCheckpointProcessUnlock(pid, &unlock); r != CUDA_SUCCESS)
      fail(pid, "cuCheckpointProcessUnlock", r);
    unlock_s = bench::seconds_since(t);
  }

  std::printf("{\"bench\":\"driver_ckpt\",\"pid\":%d,\"lock_s\":%.6f,\"checkpoint_s\":%.6f,\"restore_s\":%.6f,"
              "\"unlock_s\":%.6f}\n",
              pid, lock_s, checkpoint_s, restore_s, unlock_s);
  return 0;
}
