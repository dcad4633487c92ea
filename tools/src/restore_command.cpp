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

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "image_access.hpp"
#include "output.hpp"
#include "run_command.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/restore/handoff.hpp"
#include "vmmckpt/restore/tool/new_process.hpp"

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
      std::fprintf(stderr, "restore: %s loaded, %.2f s after the command started\n",
                   human_bytes(last.bytes_done).c_str(), seconds);
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
        return report_failure("restore", o.json,
                              "--replay and --device apply to restoring with a command, not to a "
                              "whole process (its CUDA context comes back on the GPU it had)",
                              exit_usage);
      return restore_process_command(found.string(), o.json, false, o.trust_owner, o.criu_args);
    }
    return report_failure("restore", o.json,
                          path +
                              " holds GPU memory only (no CPU part: it was not made with dump --process), so there is "
                              "no process to bring back: start a command with it, cuda-ckpt restore " +
                              path + " -- COMMAND [ARGS...]",
                          exit_usage);
  }
  if (ckpt::is_process_image(path))
    return report_failure("restore", false,
                          path + " is a whole-process image: restore it without a command (cuda-ckpt restore " + path +
                              "); the process comes back as it was",
                          exit_usage);
  if (o.json || o.trust_owner || !o.criu_args.empty())
    return report_failure("restore", false, "--json, --trust-owner and --criu-arg apply to whole-process images only",
                          exit_usage);
  restore::new_process_options plan;
  plan.image = path;
  plan.replay = o.replay;
  plan.verify_data = o.verify_first;
  plan.device = o.device;
  auto start = restore::prepare_new_process(plan);
  if (const auto& lacking = start.manifest.lacking; !lacking.empty())
    std::cerr << "cuda-ckpt restore: warning: " << path << " is a partial image: it lacks " << kinds_and_sizes(lacking)
              << " (memory vmmckpt did not own); the program gets back only its pool memory\n";
  if (const auto& imports = start.manifest.ipc_imports; !imports.empty())
    std::cerr << "cuda-ckpt restore: warning: the program had " << imports.size()
              << " allocation(s) of other processes mapped through CUDA IPC (process " << imports.front().exporter_pid
              << " first); they are not in the image and not mapped again: the program must open its handles again\n";
  restore::handoff& h = start.how;
  h.progress_fd = start_progress_reporter();
  if (struct stat st{}; h.progress_fd >= 0 && ::fstat(h.progress_fd, &st) == 0) h.progress_inode = st.st_ino;
  restore::export_to_environment(h);
  const int failed = run_under_shim(command, "restore");
  if (h.progress_fd >= 0) ::close(h.progress_fd);
  return failed;
}

subcommand add_restore(CLI::App& app, const std::vector<std::string>& trailing_command) {
  struct options : restore_command_options {
    bool no_verify = false;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand(
      "restore", "Bring a whole process back from its image, or start a command with an image's GPU memory");
  add_image(command, o->image);
  command->add_flag("--replay", o->replay,
                    "The allocator starts empty with the image's bytes in place: a program that repeats its "
                    "allocations from the start gets the same addresses and finds its data");
  command->add_flag("--no-verify", o->no_verify,
                    "Start the command after checking the image's structure only, without reading it through "
                    "first; the restoring process still checks every extent as it loads it, and its memory calls "
                    "fail if one is damaged");
  command
      ->add_option("--device", o->device,
                   "Run on this machine's GPU N (migration); the program sees it as the device it had, and "
                   "every address is unchanged")
      ->check(CLI::Range(0, 63));
  command->add_flag("--json", o->json, "Whole process: print the result as JSON");
  command->add_flag("--trust-owner", o->trust_owner,
                    "Whole process, as root: restore an image that someone other than root owns or may have written "
                    "(refused otherwise, naming the file: the restored processes run what the image holds)");
  command->add_option("--criu-arg", o->criu_args, "Whole process: one more argument for `criu restore` (repeatable)")
      ->type_name("ARG")
      ->allow_extra_args(false);
  command->allow_extras();  // a command given without "--" is named in the error, in its order
  command->footer(
      "Usage: cuda-ckpt restore DIR [--json] [--trust-owner]   (a whole-process image, from dump --process)\n"
      "       cuda-ckpt restore IMAGE [--replay] [--device N] -- COMMAND [ARGS...]\n"
      "Whole process: both parts are checked (no link or special file in the image, every CRIU file's size and\n"
      "checksum, each GPU part's structure, every pid one CRIU restores; the GPU bytes as they load), `criu\n"
      "restore` brings the processes back with their pids, the driver their CUDA contexts, and each loads its GPU\n"
      "memory at its addresses. The process runs detached; its pid is printed. As root, an image is restored only\n"
      "when nobody but root can have written it (--trust-owner: anyway). DIR left unfinished by a dump whose tool\n"
      "died after CRIU succeeded (DIR.partial-...) is completed and restored. A failed restore leaves the image\n"
      "unchanged and says why (the pid in use, CRIU missing or too old, the driver lacking the checkpoint API,\n"
      "another GPU model, not enough memory).\n"
      "With a command:\n"
      "The image is checked (structure and every checksum) before the command starts; a bad image is refused\n"
      "(--no-verify: the structure only, and the restoring process checks each extent as it loads).\n"
      "By default the image's allocations are live in the new process: pointers the program saved stay valid.\n"
      "On a terminal a progress line shows the program loading its image.");

  return {command, [o, command, &trailing_command] {
            if (!command->remaining().empty()) {
              // Words after the image without "--": the command, most likely, or an option misspelt.
              const auto extra = command->remaining();
              if (extra.front().rfind('-', 0) == 0)
                return report_failure("restore", false,
                                      "unknown option '" + extra.front() + "'; see cuda-ckpt help restore", exit_usage);
              std::string words;
              for (const auto& w : extra) words += " " + w;
              return report_failure(
                  "restore", false,
                  "the command to start goes after '--': cuda-ckpt restore " + o->image + " --" + words, exit_usage);
            }
            o->verify_first = !o->no_verify;
            return restore_command(*o, trailing_command);
          }};
}

}  // namespace vmmckpt::tools
