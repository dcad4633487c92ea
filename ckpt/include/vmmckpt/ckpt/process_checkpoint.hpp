// Whole-process checkpoint: the shim's suspend for the GPU memory, the driver's checkpoint API for what is
// left of each CUDA context, and CRIU for the CPU side (docs/whole-process.md). The restore is restore/tool's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "vmmckpt/ckpt/dump.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/ckpt/deadlines.hpp"

namespace vmmckpt::ckpt {

struct process_dump_options {
  pid_t pid = 0;
  std::filesystem::path output;  // the whole-process image directory to create
  bool leave_running = false;    // the process goes on afterwards (otherwise it ends, as with criu dump)
  copy_settings copy;
  std::chrono::milliseconds hold_deadline{default_suspend_hold};  // for each process's suspend
  std::vector<std::string> criu_args;  // more arguments for `criu dump` (--tcp-established, ...)
  // A whole-process image to be incremental on: each process's GPU part leaves the blocks unchanged since
  // its part there (same pid) to it. A process without a part there gets a full one.
  std::filesystem::path parent;
  // First a dump of each process's GPU memory while it runs (gpu/PID.pre); the processes are then stopped
  // only for the blocks changed since (gpu/PID, incremental on it), the driver's checkpoint and CRIU.
  bool pre_copy = false;
  // The tree is a multi-rank job (dump --job --process, docs/job-checkpoint.md): its ranks are cut at one point
  // and suspended together (job.hpp), and CRIU keeps their TCP connections (NCCL's bootstrap).
  bool job = false;
};

// Where the time went: seconds from the start at which each step ended, in order.
using process_phases = std::vector<std::pair<std::string, double>>;

struct process_dump_result {
  std::filesystem::path image;
  process_image description;
  double seconds = 0;
  process_phases phases;
  std::uint64_t pre_copy_bytes = 0;  // written by the pre-copies while the processes ran
  double pre_copy_held_ms = 0;       // the longest a pre-copy held its process (as a dump holds it)
  std::uint64_t held_bytes = 0;      // written by the suspends, the processes held
};

// Suspends every process under the shim in pid's tree into DIR/gpu/PID, checkpoints what is left of
// their CUDA contexts with the driver, runs `criu dump --leave-stopped` into DIR/criu and writes process.json;
// DIR appears only once complete and synced, and only then are the processes ended (or, with leave_running,
// continued). Refused before anything is touched when CRIU (4.0 or later) or the driver's checkpoint API is
// missing, when a process of the tree uses CUDA without the shim, or when it is a multi-rank NCCL job without
// `job` (a job with `job` refuses pre_copy and parent, which it does not take yet). On any
// failure before the image is complete the processes are brought back running and nothing that looks like an
// image is left; a tool killed midway leaves them alive, stopped or suspended, and recorded
// (process_recovery.hpp). Throws tool_error, criu_unavailable, driver_unavailable, image::image_error or
// interrupted.
process_dump_result dump_process(const process_dump_options& options, const progress_callback& progress = {});

}  // namespace vmmckpt::ckpt
