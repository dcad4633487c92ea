// Whole-process restore: CRIU brings the processes back, the driver their CUDA contexts, and each process loads
// its GPU memory from its part of the image (docs/whole-process.md).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "vmmckpt/ckpt/process_checkpoint.hpp"

namespace vmmckpt::restore {

struct process_restore_options {
  std::filesystem::path image;
  bool verify_data = false;            // check every GPU byte's checksum before CRIU starts
  bool trust_owner = false;            // as root: restore an image someone other than root may have written
  std::vector<std::string> criu_args;  // more arguments for `criu restore`
};

struct process_restore_result {
  pid_t pid = 0;  // the restored root process, running detached
  ckpt::process_image description;
  double seconds = 0;
  ckpt::process_phases phases;
};

// Finds the image under any of its names (an unfinished dump's is completed first), refuses as root one that
// someone else may have written (unless trust_owner), checks both parts and that every pid it names is one
// CRIU's image restores, runs `criu restore` (detached), restores and unlocks each CUDA context with the
// driver, then has each process load its GPU part from DIR/gpu/PID. The image is never changed. On failure
// what CRIU brought back is killed and the reason is thrown: the pid in use, CRIU missing or too old, the
// driver lacking the API, another GPU model, not enough memory.
process_restore_result restore_process(const process_restore_options& options,
                                       const ckpt::progress_callback& progress = {});

// One process's GPU side, when CRIU itself restores it (the CRIU plugin, criu/): the driver restores and
// unlocks its context when it left it checkpointed (or unlocks it when locked), then the process loads its GPU
// memory from `gpu_image` (where it is now; the image must be the one its suspend wrote). Throws tool_error.
void restore_gpu_side(pid_t pid, const std::filesystem::path& gpu_image);

}  // namespace vmmckpt::restore
