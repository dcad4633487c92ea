// `cuda-ckpt suspend` and `cuda-ckpt resume`: free a live process's GPU memory, and give it back.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/leftovers.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::tools {

int suspend_command(const suspend_command_options& o) {
  ckpt::suspend_options options;
  options.pid = o.pid;
  options.hold_deadline_ms = o.deadline_s * 1000;
  if (o.writers > 0) options.copy.writers = o.writers;
  options.verify = o.verify;
  options.allow_partial = o.allow_partial;
  options.copy.parent = o.parent;
  options.copy.gpu_checksums = !o.cpu_checksums;
  if (o.output.empty()) {
    options.output = ckpt::default_suspend_dir() / ("suspend-" + std::to_string(o.pid) + "-" + time_stamp());
  } else {
    options.output = o.output;
  }
  options.copy.interrupt = &catch_interrupts();
  progress_line line("suspend", !o.json);
  const auto r = ckpt::suspend(options, line.callback());
  line.finish();
  const double seconds = r.seconds;
  if (r.late) {
    // Suspended, but its answer never came: the figures are unknown, the state is not.
    if (o.json) {
      std::cout << nlohmann::json{{"pid", o.pid}, {"image", r.image.string()}, {"late", true}, {"seconds", seconds}}.dump(2)
                << "\n";
    } else {
      std::printf("process %d took the suspend but did not answer in time (it is stopped, or was stopped right "
                  "after): it is suspended with image %s, or will be when it continues\n",
                  static_cast<int>(o.pid), r.image.c_str());
    }
    return exit_ok;
  }
  if (o.json) {
    nlohmann::json out{{"pid", o.pid},
                       {"image", r.image.string()},
                       {"bytes", r.manifest.data_bytes},
                       {"freed_bytes", r.freed_bytes},
                       {"device_used_bytes_after", r.device_used_after},
                       {"hold_ms", r.hold_ms},
                       {"seconds", seconds},
                       {"lacking", kinds_and_sizes_json(r.manifest.lacking)}};
    out.update(timings_json(r));
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("suspended process %d in %.3f s: %s of GPU memory freed, image %s (%s)\n", static_cast<int>(o.pid),
                seconds, human_bytes(r.freed_bytes).c_str(), r.image.c_str(),
                human_bytes(r.manifest.data_bytes).c_str());
    std::printf("  still in use on its device(s): %s (its CUDA context, memory vmmckpt does not serve, other "
                "processes)\n",
                human_bytes(r.device_used_after).c_str());
    if (!r.manifest.lacking.empty())
      std::printf("  partial: memory vmmckpt does not own stays on the GPU, and the image lacks it: %s\n",
                  kinds_and_sizes(r.manifest.lacking).c_str());
    std::printf("  threads that call CUDA wait until `cuda-ckpt resume %d`\n", static_cast<int>(o.pid));
  }
  return exit_ok;
}

int resume_command(pid_t pid, bool as_json) {
  // A whole-process dump stopped midway may have left the process stopped (CRIU's --leave-stopped), and the
  // driver's lock or checkpoint: undone first, in that order (a stopped process answers nothing).
  const std::string continued = ckpt::continue_stopped_by_dump(pid);
  if (!continued.empty() && !as_json) std::printf("process %d: %s\n", static_cast<int>(pid), continued.c_str());
  const std::string recovered = ckpt::recover_driver_state(pid);
  if (!recovered.empty() && !as_json) std::printf("process %d: %s\n", static_cast<int>(pid), recovered.c_str());
  progress_line line("resume", !as_json);
  const auto r = ckpt::resume(pid, line.callback());
  line.finish();
  if (as_json) {
    std::cout << nlohmann::json{{"pid", pid}, {"bytes", r.bytes}, {"seconds", r.seconds}, {"image", r.image}}.dump(2)
              << "\n";
  } else {
    std::printf("resumed process %d: %s back in %.3f s from %s\n", static_cast<int>(pid), human_bytes(r.bytes).c_str(),
                r.seconds, r.image.c_str());
  }
  // An image in the default place has served its purpose; one the user named stays.
  const std::string prefix = (ckpt::suspend_dir_of(::geteuid()) / "suspend-").string();
  if (r.image.rfind(prefix, 0) == 0) {
    std::error_code ec;
    std::filesystem::remove_all(r.image, ec);
  }
  // The record of a whole-process dump or restore whose tool died has nothing more to say once its
  // processes run on.
  ckpt::settle_transactions(false);
  return exit_ok;
}

}  // namespace vmmckpt::tools
