// `cuda-ckpt suspend` and `cuda-ckpt resume`: free a live process's GPU memory, and give it back.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/driver_checkpoint.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/restore/tool/resume.hpp"

namespace vmmckpt::tools {

int suspend_command(const suspend_command_options& o) {
  ckpt::suspend_options options;
  options.pid = o.pid;
  options.hold_deadline = o.hold_deadline;
  if (o.writers > 0) options.copy.writers = o.writers;
  options.verify = o.verify;
  options.allow_partial = o.allow_partial;
  options.copy.parent = o.parent;
  options.copy.parent_in_process_image = ckpt::is_process_image_part(o.parent);
  options.copy.gpu_checksums = !o.cpu_checksums;
  if (o.output.empty()) {
    options.output = ckpt::default_suspend_dir() / ("suspend-" + std::to_string(o.pid) + "-" + time_stamp());
  } else {
    options.output = o.output;
  }
  options.copy.interrupt = &catch_interrupts();
  if (o.whole_job()) {
    if (!o.parent.empty())
      return report_failure("suspend", o.json, "--parent does not apply to a job's suspend (--job, --ranks)",
                            exit_usage);
    return suspend_job_command(o, options.copy);
  }
  progress_line line("suspend", !o.json);
  const auto r = ckpt::suspend(options, line.callback());
  line.finish();
  const double seconds = r.seconds;
  if (r.late) {
    // Suspended, but its answer never came: the figures are unknown, the state is not.
    if (o.json) {
      std::cout
          << nlohmann::json{{"pid", o.pid}, {"image", r.image.string()}, {"late", true}, {"seconds", seconds}}.dump(2)
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
                       {"zero_bytes", r.zero_bytes},
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
    if (r.zero_bytes != 0)
      std::printf("  zero blocks: %s held only zeros: recorded as such, not written\n",
                  human_bytes(r.zero_bytes).c_str());
    if (!r.manifest.lacking.empty())
      std::printf("  partial: memory vmmckpt does not own stays on the GPU, and the image lacks it: %s\n",
                  kinds_and_sizes(r.manifest.lacking).c_str());
    std::printf("  threads that call CUDA wait until `cuda-ckpt resume %d`\n", static_cast<int>(o.pid));
  }
  return exit_ok;
}

// A rank that `suspend --job` suspended comes back with its job: alone, it could not map the memory of the
// others, which stay suspended (docs/job-checkpoint.md).
void refuse_rank_of_suspended_job(pid_t pid) {
  if (!ckpt::stopped_among({pid}).empty()) return;  // it answers nothing: restore::resume says so, in its time
  std::optional<control::hello_reply> h;
  try {
    h = ckpt::control_client(pid, ckpt::deadline::in(std::chrono::seconds(2))).hello();
  } catch (const ckpt::tool_error&) {
    return;  // restore::resume says why it cannot reach the process
  }
  if (h->state != control::process_state::suspended) return;
  if (const auto whole_job = ckpt::job_resume_command(h->image))
    throw ckpt::tool_error("process " + std::to_string(pid) +
                           " is a rank of a job suspended by `suspend --job` (image " + h->image +
                           "): its ranks are resumed together, with `" + *whole_job + "`");
}

int resume_command(pid_t pid, bool as_json, std::chrono::seconds resume_deadline) {
  // A whole-process dump stopped midway may have left the process stopped (CRIU's --leave-stopped), and the
  // driver's lock or checkpoint: undone first, in that order (a stopped process answers nothing).
  const std::string continued = ckpt::continue_stopped_by_dump(pid);
  if (!continued.empty() && !as_json) std::printf("process %d: %s\n", static_cast<int>(pid), continued.c_str());
  const std::string recovered = ckpt::recover_driver_state(pid);
  if (!recovered.empty() && !as_json) std::printf("process %d: %s\n", static_cast<int>(pid), recovered.c_str());
  refuse_rank_of_suspended_job(pid);
  progress_line line("resume", !as_json);
  const auto r = restore::resume(pid, line.callback(), {}, resume_deadline);
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

subcommand add_suspend(CLI::App& app) {
  auto o = std::make_shared<suspend_command_options>();
  auto* command = app.add_subcommand("suspend", "Save a process's GPU memory and free it; the process waits");
  add_held_image(command, *o,
                 "Image directory (default /dev/shm/vmmckpt-UID/suspend-PID-TIME, removed by resume; also -D DIR)",
                 "Give up after this many whole seconds (1 to 3600), connecting and saving included: the "
                 "program is then released, not suspended");
  command->add_flag("--verify", o->verify, "Read the image back and check every checksum before the memory is freed");
  command->add_flag("--allow-partial", o->allow_partial,
                    "Suspend even when the process has device memory vmmckpt does not own: the image is marked "
                    "partial, and that memory stays on the GPU while the process is suspended");
  command
      ->add_option("--parent", o->parent,
                   "Write an incremental image: blocks unchanged since the image PARENT (weights saved earlier) "
                   "are left to it; resume reads them from there")
      ->type_name("IMAGE");
  command->add_flag("--cpu-checksums", o->cpu_checksums,
                    "Compute the block checksums on the CPU (by default on the GPU where it can; see dump)");
  command->add_option("--writers", o->writers, "Threads writing the image (default: one per core, up to 16)")
      ->check(CLI::Range(1, 256));
  command->footer(
      "Usage: cuda-ckpt suspend PID [-o DIR]   (also: cuda-ckpt suspend -t PID -D DIR)\n"
      "Nothing is freed unless the image is complete, synced and opens with every rule checked (with --verify:\n"
      "and reads back with every checksum right). Threads of the program that call CUDA\n"
      "wait until resume; its CUDA context stays on the GPU. Interrupted (Ctrl-C, SIGTERM) before the\n"
      "program took the image, the suspend is undone: the image is removed and the program goes on.\n"
      "A process with device memory vmmckpt does not own is refused with exit status 3 unless\n"
      "--allow-partial is given.\n"
      "Whole job: cuda-ckpt suspend --job PID (or --ranks PID,...): the job's ranks are brought to one point\n"
      "(see dump --help), each writes its image into DIR/PID (default /dev/shm/vmmckpt-UID/job-PID-TIME), and\n"
      "only once all are complete does every rank free its GPU memory, the memory it maps of the other ranks\n"
      "first: all of them or none. `cuda-ckpt resume --job PID` brings the job back. A rank that exits, is\n"
      "stopped or does not confirm its suspend fails the command (exit 1), named; the job is then left all\n"
      "running, or all suspended, as the message says (docs/job-checkpoint.md).");

  return {command, [o] { return suspend_command(*o); }};
}

subcommand add_resume(CLI::App& app) {
  struct options : job_command_options {
    pid_t pid = 0;
    bool json = false;
    std::chrono::seconds resume_deadline{ckpt::default_resume_deadline};
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand("resume", "Give a suspended process its GPU memory back and let it go on");
  const CLI::Option* ranks = add_job(command, *o, "Resume");
  add_pid(command, o->pid, "The suspended process", {ranks});
  command->add_flag("--json", o->json, "Print the result as JSON");
  add_hold_deadline(command, o->resume_deadline,
                    "Give up after this many whole seconds (1 to 3600; default " +
                        std::to_string(ckpt::default_resume_deadline.count()) +
                        "), loading included, saying which "
                        "process it waits for and why (a stopped one: `kill -CONT PID`); the request expires with it, "
                        "so a program that goes on later stays suspended");
  command->footer("A resume that cannot complete (not enough GPU memory, a damaged image) leaves the process\n"
                  "suspended with its image intact; it can be tried again. On a terminal a progress line shows\n"
                  "the program loading its image.");

  return {command, [o] {
            return o->whole_job() ? resume_job_command(*o, o->pid, o->json, o->resume_deadline)
                                  : resume_command(o->pid, o->json, o->resume_deadline);
          }};
}

}  // namespace vmmckpt::tools
