// `cuda-ckpt restore`: check an image, then start the command under the shim with the image to restore.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "image_access.hpp"
#include "output.hpp"
#include "run_command.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/restore/handoff.hpp"
#include "vmmckpt/restore/restore_plan.hpp"

namespace vmmckpt::tools {
namespace {

// The restored program loads its image itself, after this tool has become it (exec): a process
// of its own draws the progress line from what the shim sends on a socket, and ends when the
// shim closes it (loaded or failed) or the program exits. Returns the program's end of the socket,
// or -1 when stderr is no terminal (nothing to draw on) or the reporter cannot start.
int start_progress_reporter() {
  if (::isatty(STDERR_FILENO) != 1) return -1;
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, ends) != 0) return -1;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(ends[0]);
    ::close(ends[1]);
    return -1;
  }
  if (child == 0) {
    // Forked once more so that the reporter is not the program's child: the program's waits and
    // SIGCHLD stay its own business.
    if (::fork() != 0) ::_exit(0);
    ::close(ends[0]);
    progress_line line("restore");
    ckpt::copy_progress last{ckpt::copy_progress::stage::loading};
    const auto start = std::chrono::steady_clock::now();
    char frame[512];
    for (;;) {
      const ssize_t n = ::recv(ends[1], frame, sizeof frame, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      try {
        if (const auto f = control::decode_progress_frame(std::string(frame, static_cast<std::size_t>(n)))) {
          last.bytes_done = f->bytes_done;
          last.bytes_total = f->bytes_total;
          line.show(last);
        }
      } catch (const std::exception&) {
        // Not a frame of ours: nothing to draw.
      }
    }
    line.finish();
    if (last.bytes_total != 0 && last.bytes_done == last.bytes_total) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "restore: %s loaded, %.2f s after the command started\n", human_bytes(last.bytes_done).c_str(),
                   seconds);
    }
    ::_exit(0);
  }
  ::close(ends[1]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return ends[0];
}

}  // namespace

int restore_command(const restore_command_options& o, const std::vector<std::string>& command) {
  const std::string& path = o.image;
  if (command.empty()) {
    // A whole-process image may be under another of its names: an unfinished dump's, completed here.
    const std::filesystem::path found = ckpt::find_process_image(path);
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(found, ec)))
      return report_failure("restore", o.json, path + " does not exist", exit_failure);
    if (const std::string why = unreadable_image_directory(found.string()); !why.empty())
      return report_failure("restore", o.json, found.string() + " cannot be read (" + why + ")", exit_failure);
    if (ckpt::is_process_image(found)) {
      if (o.replay || o.device >= 0)
        return report_failure("restore", o.json, "--replay and --device apply to restoring with a command, not to a "
                              "whole process (its CUDA context comes back on the GPU it had)", exit_usage);
      return restore_process_command(found.string(), o.json, false, o.trust_owner, o.criu_args);
    }
    return report_failure("restore", o.json,
                          path + " holds GPU memory only (no CPU part: it was not made with dump --process), so there is "
                          "no process to bring back: start a command with it, cuda-ckpt restore " + path +
                          " -- COMMAND [ARGS...]", exit_usage);
  }
  if (ckpt::is_process_image(path))
    return report_failure("restore", false,
                          path + " is a whole-process image: restore it without a command (cuda-ckpt restore " + path +
                          "); the process comes back as it was", exit_usage);
  if (o.json || o.trust_owner || !o.criu_args.empty())
    return report_failure("restore", false, "--json, --trust-owner and --criu-arg apply to whole-process images only",
                          exit_usage);
  const bool replay = o.replay, verify_first = o.verify_first;
  const int device = o.device;
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
  if (const auto& imports = reader.info().ipc_imports; !imports.empty())
    std::cerr << "cuda-ckpt restore: warning: the program had " << imports.size()
              << " allocation(s) of other processes mapped through CUDA IPC (process " << imports.front().exporter_pid
              << " first); they are not in the image and not mapped again: the program must open its handles again\n";
  // The new process places its pools exactly where the image's were.
  const auto plan = restore::plan_restore(reader.info(), path, device >= 0);
  if (device >= 0) {
    // Migration: the program's device becomes this machine's GPU `device`.
    const driver_api& d = ckpt::driver();
    if (d.cuInit(0) != CUDA_SUCCESS) throw image::image_error("--device: the CUDA driver finds no GPU here");
    int count = 0;
    d.cuDeviceGetCount(&count);
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
  h.progress_fd = start_progress_reporter();
  if (struct stat st{}; h.progress_fd >= 0 && ::fstat(h.progress_fd, &st) == 0) h.progress_inode = st.st_ino;
  restore::export_to_environment(h);
  const int failed = run_under_shim(command, "restore");
  if (h.progress_fd >= 0) ::close(h.progress_fd);
  return failed;
}

}  // namespace vmmckpt::tools
