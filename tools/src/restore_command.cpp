// `cuda-ckpt restore`: check an image, then start the command under the shim with the image to restore.
#include <cuda.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "output.hpp"
#include "run_command.hpp"
#include "vmmckpt/image.hpp"
#include "vmmckpt/restore/handoff.hpp"
#include "vmmckpt/restore/restore_plan.hpp"

namespace vmmckpt::tools {

int restore_command(const std::string& path, bool replay, int device, bool verify_first,
                    const std::vector<std::string>& command) {
  if (command.empty()) {
    std::cerr << "cuda-ckpt restore: no command given (usage: cuda-ckpt restore IMAGE [--replay] -- COMMAND...)\n";
    return exit_usage;
  }
  // Refuse a bad image before anything starts: the program never sees it. (The restoring
  // process checks every extent again as it loads: the image may change in between.)
  const auto reader = image::reader::open(path);
  if (verify_first)
    reader.verify_data();
  else
    reader.verify_manifest();
  if (const auto& lacking = reader.info().lacking; !lacking.empty())
    std::cerr << "cuda-ckpt restore: warning: " << path << " is a partial image: it lacks " << kinds_and_sizes(lacking)
              << " (memory vmmckpt did not own); the program gets back only its pool memory\n";
  // The new process places its pools exactly where the image's were.
  const auto plan = restore::plan_restore(reader.info(), path, device >= 0);
  if (device >= 0) {
    // Migration: the program's device becomes this machine's GPU `device`.
    if (cuInit(0) != CUDA_SUCCESS) throw image::image_error("--device: no CUDA driver here");
    int count = 0;
    cuDeviceGetCount(&count);
    const std::string visible =
        restore::visible_devices_for(plan.device, device, count, std::getenv("CUDA_VISIBLE_DEVICES"));
    ::setenv("CUDA_VISIBLE_DEVICES", visible.c_str(), 1);
  }
  restore::handoff h;
  h.image = std::filesystem::absolute(path).string();
  h.how = replay ? restore::mode::replay : restore::mode::live;
  h.pid = ::getpid();  // exec keeps the pid
  h.pool_base = plan.pool_base;
  h.pool_size = plan.pool_size;
  h.vmm_base = plan.vmm_base;
  h.vmm_window = plan.vmm_window;
  restore::export_to_environment(h);
  return run_under_shim(command);
}

}  // namespace vmmckpt::tools
