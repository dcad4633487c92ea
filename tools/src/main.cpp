// cuda-ckpt: entry point, subcommands and exit codes.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "output.hpp"
#include "run_command.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/support/descriptor_room.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/support/version.hpp"

using namespace vmmckpt::tools;

namespace {

// Only the main help: where cuda-ckpt runs with no GPU driver (storage and login nodes, CI).
constexpr const char* driver_help =
    "dump, suspend and restore --device load the CUDA driver ($VMMCKPT_LIBCUDA, default libcuda.so.1);\n"
    "the other commands run without one.\n";

constexpr const char* exit_code_help =
    "Exit codes:\n"
    "  0    success (verify: the image is good)\n"
    "  1    the operation failed, or verify found a defect (the message says which)\n"
    "  2    bad command line\n"
    "  3    dump, suspend: refused, the process has device memory vmmckpt does not own (the message\n"
    "       names it); nothing was written and the process goes on (--allow-partial: write it anyway)\n"
    "  126  run: the command cannot be executed\n"
    "  127  run: the command was not found\n"
    "  130  dump, suspend: interrupted by SIGINT (143: SIGTERM); the unfinished image is removed and the\n"
    "       program goes on (suspend: not suspended)\n"
    "  any other: run passes on the command's own exit status\n";

// A process id: a positive integer (a negative one is a usage error, not a missing process).
const CLI::Validator process_id(
    [](std::string& text) -> std::string {
      const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || text.size() > 9 || std::stol(text) <= 0) return "a process id is a positive integer, not '" + text + "'";
      return {};
    },
    "");

// Whole seconds from 1 to 3600: "1.5" is refused as not a whole number, not as out of range.
const CLI::Validator whole_seconds(
    [](std::string& text) -> std::string {
      const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) return "takes whole seconds (an integer from 1 to 3600), not '" + text + "'";
      if (text.size() > 4 || std::stoi(text) < 1 || std::stoi(text) > 3600)
        return "takes whole seconds from 1 to 3600, not " + text;
      return {};
    },
    "INT in [1 - 3600]");

// The process of dump, suspend, resume and check: a positional, or -t/--pid as CRIU and NVIDIA's
// cuda-checkpoint spell it; one of the two, each listed once in the help.
void add_pid(CLI::App* command, pid_t& pid, const std::string& what) {
  auto* positional = command->add_option("pid", pid, what + "; or -t PID")->check(process_id)->type_name("PID");
  auto* flag = command->add_option("-t,--pid", pid, "The same, as CRIU and cuda-checkpoint spell it")
                   ->check(process_id)
                   ->type_name("PID");
  command->parse_complete_callback([positional, flag] {
    if (positional->count() + flag->count() == 0) throw CLI::RequiredError("a process: PID, or -t PID");
    if (positional->count() + flag->count() > 1) throw CLI::ValidationError("one process: PID, or -t PID, not both");
  });
}

// An image directory read by inspect, verify, cat and restore: a positional, or -D DIR as CRIU spells it.
CLI::Option* add_image(CLI::App* command, std::string& path) {
  return command->add_option("image,-D", path, "Image directory")->required()->type_name("DIR");
}

// Whether the command line asks for JSON (before any "--"): failures are then reported as JSON too.
bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--json") return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  ignore_file_size_signal();
  // A dump receives a descriptor per exported piece of memory in the hold and keeps its parents' data
  // files open: the table grows now, while this process has one thread and growing costs nothing.
  vmmckpt::grow_descriptor_table(4096);
  CLI::App app{"cuda-ckpt: deterministic-address checkpoint/restart for CUDA programs", "cuda-ckpt"};
  app.footer(std::string(driver_help) + "\n" + exit_code_help);
  app.set_version_flag("--version", std::string("cuda-ckpt ") + VMMCKPT_VERSION);
  app.require_subcommand(1);

  auto* run = app.add_subcommand("run", "Run a command with its device allocations served from the vmmckpt pool");
  run->footer(
      "Usage: cuda-ckpt run [--] COMMAND [ARGS...]\n"
      "Sets LD_PRELOAD to libvmmckpt.so ($VMMCKPT_SHIM, else found in ../lib, the install's library directory\n"
      "or ../lib/<multiarch> next to cuda-ckpt's real directory) and executes the command.\n"
      "Example: cuda-ckpt run -- python train.py --epochs 3");
  run->prefix_command();  // everything after the first word belongs to the command

  bool ps_json = false;
  pid_t ps_pid = 0;
  auto* ps = app.add_subcommand("ps", "List the processes running under vmmckpt, and images of processes that died");
  ps->add_option("pid,-t,--pid", ps_pid, "Only this process (an error says why when it is not under vmmckpt)")
      ->check(process_id)
      ->type_name("PID");
  ps->add_flag("--json", ps_json, "Print JSON");
  ps->footer(ps_help_footer);

  pid_t check_pid = 0;
  bool check_json = false;
  auto* check = app.add_subcommand("check", "Check a process's pool: placement and physical memory agree");
  add_pid(check, check_pid, "The process (running under vmmckpt)");
  check->add_flag("--json", check_json, "Print JSON");

  dump_command_options dump_options;
  auto* dump = app.add_subcommand("dump", "Write a consistent image of a running process's GPU memory");
  add_pid(dump, dump_options.pid, "The process (running under vmmckpt)");
  dump->add_option("-o,--output,-D", dump_options.output,
                   "Image directory to create (default ./vmmckpt-PID-TIME; also -D DIR)")
      ->type_name("DIR");
  dump->add_flag("--json", dump_options.json, "Print the result as JSON");
  dump->add_option("--deadline", dump_options.deadline_s,
                   "Give up after this many whole seconds (1 to 3600), connecting and preparing included; the "
                   "program is released by then, dump or not")
      ->capture_default_str()->check(whole_seconds)->type_name("INT");
  dump->add_option("--chunk", dump_options.chunk, "Staging buffer size, 1M to 1G (K/M/G suffixes)")
      ->capture_default_str()->type_name("SIZE");
  dump->add_option("--staging", dump_options.staging,
                   "Most pinned host memory for staging (K/M/G/T suffixes); a dump that fits is held only for its "
                   "copy out of the GPU")
      ->capture_default_str()->type_name("SIZE");
  dump->add_option("--streams", dump_options.streams, "Copy streams")->capture_default_str()->check(CLI::Range(1, 16));
  dump->add_flag("--no-gpu-snapshot", dump_options.no_gpu_snapshot,
                 "Hold the program until its memory is on the host, even when the GPU has room for a copy");
  dump->add_flag("--allow-partial", dump_options.allow_partial,
                 "Write the image even when the process has device memory vmmckpt does not own (managed memory, "
                 "CUDA arrays, memory pools it created, VMM that passes through): the image is marked partial "
                 "and lists what it lacks");
  dump->add_option("--parent", dump_options.parent,
                   "Write an incremental image: blocks unchanged since the image PARENT are left to it (it must "
                   "stay, or be merged: cuda-ckpt merge). With --process, PARENT is a whole-process image and each "
                   "process's GPU part is incremental on its part there")
      ->type_name("IMAGE");
  dump->add_flag("--cpu-checksums", dump_options.cpu_checksums,
                 "Compute the block checksums on the CPU, as the writers write. By default a kernel built into "
                 "cuda-ckpt computes them on the GPU: all of them for an incremental dump (which then copies only "
                 "changed blocks out of the GPU), those of the GPU snapshot for a full one; where it cannot, the "
                 "CPU does, and --json says why (checksums.why_not_gpu)");
  dump->add_option("--writers", dump_options.writers, "Threads writing the image, one data file each (default: one per core, up to 16)")
      ->check(CLI::Range(1, 256));
  dump->add_option("--every", dump_options.every_s,
                   "A series: one dump now and one every SECONDS into DIR/0000, DIR/0001, ..., each incremental on "
                   "the one before (one line, or with --json one JSON line, per image); ends when the process does, "
                   "after --count dumps, or at SIGINT/SIGTERM")
      ->check(CLI::Range(0.001, 1e7))->type_name("SECONDS");
  dump->add_option("--count", dump_options.count, "With --every: stop after this many dumps (default: no limit)")
      ->check(CLI::Range(1, 1000000));
  dump->add_option("--full-every", dump_options.full_every,
                   "With --every: a full image after this many incremental ones (bounds the chains restore reads)")
      ->capture_default_str()->check(CLI::Range(0, 30));
  dump->add_flag("--process", dump_options.process,
                 "The whole process and its descendants, CPU side too (CRIU 4.0 or later, the driver's checkpoint "
                 "API): `cuda-ckpt restore DIR` brings it back. The process ends when the dump completes");
  dump->add_flag("--leave-running", dump_options.leave_running,
                 "With --process: the process goes on afterwards (periodic checkpoints)");
  dump->add_option("--criu-arg", dump_options.criu_args,
                   "With --process: one more argument for `criu dump` (repeatable; e.g. --criu-arg=--tcp-established)")
      ->type_name("ARG")->allow_extra_args(false);
  dump->footer(
      "Usage: cuda-ckpt dump PID [-o DIR]   (also: cuda-ckpt dump -t PID -D DIR)\n"
      "The program is held (its GPU work stopped and drained) only until its memory is copied: to spare\n"
      "GPU memory when the device has room for it (a quarter staying free), otherwise out of the GPU;\n"
      "with room for part of it, the last part is copied on the GPU and the rest out of it. On a terminal\n"
      "a progress line shows the copy and the writing, and a line says when the program was released.\n"
      "Exit status 1 with a message when the process does not exist, is not under vmmckpt, belongs to\n"
      "another user, exits during the dump, or the image cannot be written (full disk).\n"
      "The image appears under its final name only once complete and synced: a failed or interrupted\n"
      "(Ctrl-C, SIGTERM) dump leaves none, and the program goes on.\n"
      "A process with device memory vmmckpt does not own is refused with exit status 3, naming each kind and\n"
      "its size, unless --allow-partial is given.\n"
      "\n"
      "Whole process: cuda-ckpt dump PID --process -o DIR [--leave-running]\n"
      "Each process of PID's tree under vmmckpt is suspended into DIR/gpu/PID (its GPU memory copied out and\n"
      "freed), the driver checkpoints what is left of its CUDA context, and `criu dump` writes the CPU side\n"
      "into DIR/criu; process.json lists and checksums both parts. DIR appears only once complete. A failure at\n"
      "any step brings the processes back running and leaves no image; if cuda-ckpt itself is killed midway,\n"
      "`cuda-ckpt resume PID` brings the process back from whatever state it was left in. The time the process\n"
      "was stopped is reported. CRIU: $VMMCKPT_CRIU, else criu on PATH (scripts/provision-criu.sh).");

  std::string merge_path, merge_output;
  bool merge_json = false;
  auto* merge = app.add_subcommand("merge", "Write an incremental image and its parents as one full image");
  add_image(merge, merge_path);
  merge->add_option("-o,--output", merge_output, "The full image to create")->required()->type_name("DIR");
  merge->add_flag("--json", merge_json, "Print the result as JSON");
  merge->footer("Usage: cuda-ckpt merge IMAGE -o FULL\n"
                "Every block is read from wherever the chain holds it and checked; FULL has no parent and appears\n"
                "only once complete and synced. The chain is left as it was.");

  std::string rm_path;
  bool rm_force = false, rm_json = false;
  auto* rm = app.add_subcommand("rm", "Delete an image, unless another image in its directory is its child");
  add_image(rm, rm_path);
  rm->add_flag("--force", rm_force, "Delete it even if incremental images name it as their parent (they break)");
  rm->add_flag("--json", rm_json, "Print the result as JSON");
  rm->footer("An image cannot know its children: rm looks for them among the images next to it (the same\n"
             "directory), where dump --parent leaves them by default. A child kept elsewhere is not seen.");

  std::string inspect_path;
  bool inspect_json = false;
  auto* inspect = app.add_subcommand("inspect", "Summarize an image and list its allocations");
  add_image(inspect, inspect_path);
  inspect->add_flag("--json", inspect_json, "Print the manifest as JSON");

  std::string verify_path;
  bool verify_json = false;
  auto* verify = app.add_subcommand("verify", "Check an image's structure and every checksum");
  add_image(verify, verify_path);
  verify->add_flag("--json", verify_json, "Print the result as JSON");

  std::string cat_path, cat_addr, cat_size, cat_output;
  auto* cat = app.add_subcommand("cat", "Write an image's bytes for an address range, every checksum checked");
  add_image(cat, cat_path);
  cat->add_option("addr", cat_addr, "First address (0x hex or decimal)")->required()->type_name("ADDR");
  cat->add_option("size", cat_size, "Number of bytes (0x hex or decimal, K/M/G/T)")->required()->type_name("SIZE");
  cat->add_option("-o,--output", cat_output, "Write to this file (created 0600, only when complete) instead of stdout")
      ->type_name("FILE");
  cat->footer(
      "Usage: cuda-ckpt cat IMAGE ADDR SIZE [-o FILE]   (also: cuda-ckpt cat -D IMAGE ADDR SIZE)\n"
      "Each extent the range touches is read whole and its checksum checked before any of its bytes are written.\n"
      "Exit status 1, naming it, when a byte of the range is in no extent (nothing is written) or an extent is\n"
      "damaged (the bytes before it, all checked, may have been written; with -o no file is left).");

  suspend_command_options suspend_options;
  std::vector<std::string> gc_dirs;
  bool gc_dry_run = false, gc_json = false;
  auto* gc = app.add_subcommand("gc", "Remove what killed tools left behind, when no process depends on it");
  gc->add_option("dirs", gc_dirs, "Directories to scan (default: the default suspend directory, /dev/shm/vmmckpt-UID)")
      ->type_name("DIR");
  gc->add_flag("--dry-run", gc_dry_run, "Say what would be removed, remove nothing");
  gc->add_flag("--json", gc_json, "Print the result as JSON");
  gc->footer(
      "Removes unfinished images (NAME.partial-PID-...) whose writer is gone; suspend images nobody depends on\n"
      "(withdrawn, or whose tool died before the program took them, or whose program is gone or resumed);\n"
      "and control socket files nobody listens at any more (their process is gone; only sockets, never another\n"
      "file). A suspend image of a process that does not answer (stopped, busy) stays. `cuda-ckpt ps` lists\n"
      "the images of processes that died as orphaned, with their size and the gc command that removes them.");

  auto* suspend = app.add_subcommand("suspend", "Save a process's GPU memory and free it; the process waits");
  add_pid(suspend, suspend_options.pid, "The process (running under vmmckpt)");
  suspend->add_option("-o,--output,-D", suspend_options.output,
                      "Image directory (default /dev/shm/vmmckpt-UID/suspend-PID-TIME, removed by resume; also -D DIR)")
      ->type_name("DIR");
  suspend->add_flag("--json", suspend_options.json, "Print the result as JSON");
  suspend->add_option("--deadline", suspend_options.deadline_s,
                      "Give up after this many whole seconds (1 to 3600), connecting and saving included: the "
                      "program is then released, not suspended")
      ->capture_default_str()->check(whole_seconds)->type_name("INT");
  suspend->add_flag("--verify", suspend_options.verify,
                    "Read the image back and check every checksum before the memory is freed");
  suspend->add_flag("--allow-partial", suspend_options.allow_partial,
                    "Suspend even when the process has device memory vmmckpt does not own: the image is marked "
                    "partial, and that memory stays on the GPU while the process is suspended");
  suspend->add_option("--parent", suspend_options.parent,
                      "Write an incremental image: blocks unchanged since the image PARENT (weights saved earlier) "
                      "are left to it; resume reads them from there")
      ->type_name("IMAGE");
  suspend->add_flag("--cpu-checksums", suspend_options.cpu_checksums,
                    "Compute the block checksums on the CPU (by default on the GPU where it can; see dump)");
  suspend->add_option("--writers", suspend_options.writers, "Threads writing the image (default: one per core, up to 16)")
      ->check(CLI::Range(1, 256));
  suspend->footer(
      "Usage: cuda-ckpt suspend PID [-o DIR]   (also: cuda-ckpt suspend -t PID -D DIR)\n"
      "Nothing is freed unless the image is complete, synced and opens with every rule checked (with --verify:\n"
      "and reads back with every checksum right). Threads of the program that call CUDA\n"
      "wait until resume; its CUDA context stays on the GPU. Interrupted (Ctrl-C, SIGTERM) before the\n"
      "program took the image, the suspend is undone: the image is removed and the program goes on.\n"
      "A process with device memory vmmckpt does not own is refused with exit status 3 unless\n"
      "--allow-partial is given.");

  pid_t resume_pid = 0;
  bool resume_json = false;
  auto* resume = app.add_subcommand("resume", "Give a suspended process its GPU memory back and let it go on");
  add_pid(resume, resume_pid, "The suspended process");
  resume->add_flag("--json", resume_json, "Print the result as JSON");
  resume->footer("A resume that cannot complete (not enough GPU memory, a damaged image) leaves the process\n"
                 "suspended with its image intact; it can be tried again. On a terminal a progress line shows\n"
                 "the program loading its image.");

  restore_command_options restore_options;
  auto* restore = app.add_subcommand(
      "restore", "Bring a whole process back from its image, or start a command with an image's GPU memory");
  add_image(restore, restore_options.image);
  restore->add_flag("--replay", restore_options.replay,
                    "The allocator starts empty with the image's bytes in place: a program that repeats its "
                    "allocations from the start gets the same addresses and finds its data");
  bool restore_no_verify = false;
  restore->add_flag("--no-verify", restore_no_verify,
                    "Start the command after checking the image's structure only, without reading it through "
                    "first; the restoring process still checks every extent as it loads it, and its memory calls "
                    "fail if one is damaged");
  restore->add_option("--device", restore_options.device,
                      "Run on this machine's GPU N (migration); the program sees it as the device it had, and "
                      "every address is unchanged")
      ->check(CLI::Range(0, 63));
  restore->add_flag("--json", restore_options.json, "Whole process: print the result as JSON");
  restore->add_flag("--trust-owner", restore_options.trust_owner,
                    "Whole process, as root: restore an image that someone other than root owns or may have written "
                    "(refused otherwise, naming the file: the restored processes run what the image holds)");
  restore->add_option("--criu-arg", restore_options.criu_args,
                      "Whole process: one more argument for `criu restore` (repeatable)")
      ->type_name("ARG")->allow_extra_args(false);
  restore->allow_extras();  // a command given without "--" is named in the error, in its order
  restore->footer(
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

  // Every command's help ends with the exit codes, as the program's does.
  for (auto* command : app.get_subcommands([](CLI::App*) { return true; })) {
    const std::string own = command->get_footer();
    command->footer(own.empty() ? exit_code_help : own + "\n\n" + exit_code_help);
  }

  const bool json = json_requested(argc, argv);
  // What CLI11 does not say the usual way: an unknown command, and `help [COMMAND]`.
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string word = argv[1];
    if (word == "help") {
      if (argc == 2) {
        std::cout << app.help();
        return exit_ok;
      }
      CLI::App* command = nullptr;
      try {
        command = app.get_subcommand(argv[2]);
      } catch (const CLI::OptionNotFound&) {
      }
      if (command == nullptr)
        return report_failure("", false, std::string("unknown command '") + argv[2] + "'; see cuda-ckpt --help", exit_usage);
      std::cout << command->help(app.get_name());
      return exit_ok;
    }
    bool known = false;
    for (const auto* command : app.get_subcommands([](CLI::App*) { return true; })) known |= command->get_name() == word;
    if (!known) return report_failure("", json, "unknown command '" + word + "'; see cuda-ckpt --help", exit_usage);
  }
  const std::string command = argc >= 2 && argv[1][0] != '-' ? argv[1] : "";
  // A misspelt VMMCKPT_LOG_LEVEL is said once, here; under run and restore the shim in the program says it.
  if (command != "run" && command != "restore") vmmckpt::log::threshold();

  // The command of run and restore is everything after the first "--" (or,
  // for run, after its first word): CLI11 parses only what comes before.
  std::vector<char*> args(argv, argv + argc);
  std::vector<std::string> trailing_command;
  if (command == "restore") {
    for (std::size_t i = 2; i < args.size(); ++i) {
      if (std::string_view(args[i]) == "--") {
        trailing_command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
        args.resize(i);
        break;
      }
    }
  }
  if (args.size() >= 3 && command == "run" && std::string_view(args[2]) == "--") args.erase(args.begin() + 2);

  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // As every other failure: `cuda-ckpt COMMAND: message`, and where to look for help.
    const std::string help = command.empty() ? "cuda-ckpt --help" : "cuda-ckpt help " + command;
    return report_failure(command, json, std::string(e.what()) + (json ? "" : "; see " + help), exit_usage);
  }
  if (*restore && !restore->remaining().empty()) {
    // Words after the image without "--": the command, most likely, or an option misspelt.
    const auto extra = restore->remaining();
    if (extra.front().rfind("-", 0) == 0)
      return report_failure("restore", false, "unknown option '" + extra.front() + "'; see cuda-ckpt help restore",
                            exit_usage);
    std::string words;
    for (const auto& w : extra) words += " " + w;
    return report_failure("restore", false,
                          "the command to start goes after '--': cuda-ckpt restore " + restore_options.image + " --" + words,
                          exit_usage);
  }

  try {
    if (*run) return run_under_shim(run->remaining());
    if (*ps) return ps_command(ps_pid, ps_json);
    if (*check) return check_command(check_pid, check_json);
    if (*dump) return dump_command(dump_options);
    if (*inspect) return inspect_command(inspect_path, inspect_json);
    if (*merge) return merge_command(merge_path, merge_output, merge_json);
    if (*rm) return rm_command(rm_path, rm_force, rm_json);
    if (*verify) return verify_command(verify_path, verify_json);
    if (*cat) return cat_command(cat_path, cat_addr, cat_size, cat_output);
    if (*restore) {
      restore_options.verify_first = !restore_no_verify;
      return restore_command(restore_options, trailing_command);
    }
    if (*suspend) return suspend_command(suspend_options);
    if (*resume) return resume_command(resume_pid, resume_json);
    if (*gc) return gc_command(gc_dirs, gc_dry_run, gc_json);
  } catch (const vmmckpt::ckpt::interrupted& e) {
    // By now the unfinished image is gone and the connection closed: the program goes on.
    return report_failure(command, json,
                          std::string(e.what()) + ": no image was written, and the program was released and goes on" +
                              (command == "suspend" ? ", not suspended" : ""),
                          128 + e.signal);
  } catch (const vmmckpt::ckpt::partial_refused& e) {
    return report_failure(command, json,
                          "process " + std::to_string(e.pid) +
                              " has device memory that vmmckpt does not own, which no image would hold: " +
                              kinds_and_sizes(e.not_owned) +
                              ". Nothing was written and the process goes on. Pass --allow-partial to write an image "
                              "marked partial that lacks it.",
                          exit_partial_refused);
  } catch (const vmmckpt::ckpt::driver_unavailable& e) {
    return report_failure(command, json,
                          std::string(e.what()) + ". " + command +
                              " needs it; inspect, verify, cat, ps and gc do not (VMMCKPT_LIBCUDA names the library "
                              "to load, default libcuda.so.1)",
                          exit_failure);
  } catch (const vmmckpt::ckpt::tool_error& e) {
    return report_failure(command, json, e.what(), exit_failure);
  } catch (const vmmckpt::image::image_error& e) {
    return report_failure(command, json, e.what(), exit_failure);
  } catch (const std::exception& e) {
    return report_failure(command, json, std::string("unexpected error: ") + e.what(), exit_failure);
  }
  return exit_usage;
}
