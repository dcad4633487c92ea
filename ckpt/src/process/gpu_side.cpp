// One process's GPU side of a whole-process checkpoint run by CRIU: suspend and driver checkpoint (the way
// back is restore/tool's restore_gpu_side).
#include "vmmckpt/ckpt/gpu_side.hpp"

#include <chrono>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/driver_checkpoint.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {
namespace {
// The driver's lock waits for CUDA calls under way to return; the shim's gate has stopped new ones.
constexpr unsigned driver_lock_timeout_ms = 10'000;
}  // namespace

bool has_gpu_side(pid_t pid) {
  if (shim_in(pid) != shim_presence::loaded) return false;
  // A busy or loaded machine may keep the answer past ps's second: a program of ours is given longer,
  // since leaving one that did not answer to CRIU alone would lose its GPU memory.
  const auto entries = list_processes(pid, std::chrono::milliseconds(10'000));
  if (entries.empty()) return false;
  const process_entry& e = entries.front();
  if (e.hello) return true;
  if (e.status == "no control server") return false;  // no CUDA call yet: nothing of the GPU to keep
  throw tool_error("process " + std::to_string(pid) + " runs under vmmckpt but did not answer (" + e.status +
                   (e.problem.empty() ? "" : ": " + e.problem) +
                   "): its GPU memory cannot be left to CRIU alone, so the dump is refused");
}

suspend_result checkpoint_gpu_side(pid_t pid, const std::filesystem::path& gpu_image,
                                   std::chrono::milliseconds hold_deadline) {
  if (const std::string missing = driver_checkpoint_missing(); !missing.empty())
    throw tool_error(missing + ": a whole-process checkpoint needs it");
  suspend_options so;
  so.pid = pid;
  so.output = gpu_image;
  so.hold_deadline = hold_deadline;
  so.allow_partial = true;  // what the shim does not own stays in the context: the driver checkpoints it
  suspend_result s = suspend(so);
  bool locked = false;
  try {
    if (s.late) throw tool_error("process " + std::to_string(pid) + " took the suspend but did not answer in time");
    if (!s.manifest.ipc_imports.empty() || (s.manifest.vmm && !s.manifest.vmm->imports.empty()))
      throw tool_error("process " + std::to_string(pid) +
                       " maps GPU memory of another process: whole-process checkpoints of processes that share memory "
                       "are not supported");
    driver_lock(pid, driver_lock_timeout_ms);
    locked = true;
    driver_checkpoint(pid);
  } catch (...) {
    if (locked) driver_unlock(pid);
    request_resume(pid, {});
    throw;
  }
  return s;
}

}  // namespace vmmckpt::ckpt
