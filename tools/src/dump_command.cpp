// `cuda-ckpt dump`: parse options, run the dump engine, report.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <iostream>
#include <iterator>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/dump.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::tools {

namespace {

namespace fs = std::filesystem;

// What a dump's summary shows besides the result's own fields.
struct dump_figures {
  std::size_t allocations = 0;
  double gbps = 0, copy_gbps = 0;  // the bytes written over the whole command, and over the copy
};

dump_figures figures_of(const ckpt::dump_result& result) {
  dump_figures f;
  for (const auto& pool : result.manifest.pools) f.allocations += pool.allocations.size();
  // The bytes the dump covered: an incremental dump checks them all and writes only what changed, so a
  // rate over what it wrote says nothing (0.00 GB/s for one with nothing changed).
  const auto bytes = static_cast<double>(result.manifest.data_bytes + result.unchanged_bytes + result.zero_bytes);
  if (result.seconds > 0) f.gbps = bytes / result.seconds / 1e9;
  if (result.copy_seconds > 0) f.copy_gbps = bytes / result.copy_seconds / 1e9;
  return f;
}

nlohmann::json result_json(const dump_command_options& o, const ckpt::dump_result& result, const fs::path& parent) {
  const dump_figures f = figures_of(result);
  nlohmann::json out = {{"image", result.image.string()},
                        {"pid", o.pid},
                        {"bytes", result.manifest.data_bytes},
                        {"allocations", f.allocations},
                        {"seconds", result.seconds},
                        {"gb_per_s", f.gbps},
                        {"copy_seconds", result.copy_seconds},
                        {"copy_gb_per_s", f.copy_gbps},
                        {"hold_ms", result.hold_ms},
                        {"gpu_snapshot", result.gpu_snapshot},
                        {"gpu_snapshot_bytes", result.snapshot_bytes},
                        {"data_files", result.manifest.data_files},
                        {"parent", parent.empty() ? nlohmann::json(nullptr) : nlohmann::json(parent.string())},
                        {"unchanged_bytes", result.unchanged_bytes},
                        {"zero_bytes", result.zero_bytes},
                        {"staging_bytes", result.staging_bytes},
                        {"staged_bytes", result.staged_bytes},
                        {"parked_bytes", result.parked_bytes},
                        {"held_write_bytes", result.held_write_bytes},
                        {"staging_needed_bytes", result.staging_needed_bytes()},
                        {"released_s", result.released_s},
                        {"lacking", kinds_and_sizes_json(result.manifest.lacking)}};
  out.update(timings_json(result));
  return out;
}

// A --staging argument of at least `bytes`: whole MiB, or whole GiB from 1 GiB on.
std::string staging_argument(std::uint64_t bytes) {
  constexpr std::uint64_t mib = 1ULL << 20, gib = 1ULL << 30;
  return bytes >= gib ? std::to_string((bytes + gib - 1) / gib) + "G" : std::to_string((bytes + mib - 1) / mib) + "M";
}

void print_result(const dump_command_options& o, const ckpt::dump_result& result, const fs::path& parent) {
  const dump_figures f = figures_of(result);
  std::printf("dumped %s in %zu allocations of process %d to %s\n", human_bytes(result.manifest.data_bytes).c_str(),
              f.allocations, static_cast<int>(o.pid), result.image.c_str());
  std::printf(
      "  %.3f s in all (%.2f GB/s); program held %.1f ms while its memory was copied %s in %.3f s (%.2f GB/s)\n",
      result.seconds, f.gbps, result.hold_ms,
      !result.gpu_snapshot                                 ? "out of the GPU"
      : result.snapshot_bytes < result.manifest.data_bytes ? "partly to spare GPU memory, partly out of the GPU"
                                                           : "to spare GPU memory",
      result.copy_seconds, f.copy_gbps);
  if (!parent.empty())
    std::printf("  incremental: %s unchanged since %s, left to it\n", human_bytes(result.unchanged_bytes).c_str(),
                parent.c_str());
  if (result.zero_bytes != 0)
    std::printf("  zero blocks: %s held only zeros: recorded as such, not written\n",
                human_bytes(result.zero_bytes).c_str());
  if (result.parked_bytes != 0)
    std::printf("  %s waited in host memory while the program went on, written after its release\n",
                human_bytes(result.parked_bytes).c_str());
  if (result.held_write_bytes != 0)
    std::printf("  the hold covered writes: %s went to the image while the program waited for staging; "
                "--staging %s (or that much free memory) would have released it once its bytes were in host "
                "memory\n",
                human_bytes(result.held_write_bytes).c_str(), staging_argument(result.staging_needed_bytes()).c_str());
  if (!result.manifest.lacking.empty())
    std::printf("  partial: the image lacks %s (memory vmmckpt does not own)\n",
                kinds_and_sizes(result.manifest.lacking).c_str());
  std::fflush(stdout);
}

// The series' directory, made if missing, and the number of its next image: going on from those already there.
// False when it cannot be made.
bool series_directory(const fs::path& dir, int& next) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) return false;
  next = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name.size() <= 9 && name.find_first_not_of("0123456789") == std::string::npos)
      next = std::max(next, std::stoi(name) + 1);
  }
  return true;
}

// Waits until `due`; false when a signal came first.
bool wait_until(std::chrono::steady_clock::time_point due, const std::atomic<int>& interrupt) {
  while (std::chrono::steady_clock::now() < due && interrupt.load() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return interrupt.load() == 0;
}

// One dump of the series; none (nullopt) when the program has ended, or was ending and failed it (its CUDA
// teardown can take a while: it is given a moment). Any other failure is thrown.
std::optional<ckpt::dump_result> dump_unless_ended(pid_t pid, const ckpt::dump_options& options) {
  if (!ckpt::process_alive(pid)) return std::nullopt;
  try {
    return ckpt::dump(options);
  } catch (const ckpt::interrupted&) {
    throw;
  } catch (const std::exception&) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (ckpt::process_alive(pid) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (ckpt::process_alive(pid)) throw;
    return std::nullopt;
  }
}

// One image of the series, reported: a line of JSON, or the summary. `used`: the parent it actually has.
void report_series_image(const dump_command_options& o, const ckpt::dump_options& options,
                         const ckpt::dump_result& result, const fs::path& used) {
  if (!result.parent_dropped.empty() && !o.json)
    std::printf("%s changed since this series wrote it (%s): %s is a full image\n", options.copy.parent.c_str(),
                result.parent_dropped.c_str(), options.output.c_str());
  if (o.json) {
    auto line = result_json(o, result, used);
    if (!result.parent_dropped.empty()) line["parent_dropped"] = result.parent_dropped;
    std::cout << line.dump() << std::endl;  // one line per image
  } else {
    print_result(o, result, used);
  }
}

// dump --every: one image now and one every `every_s` seconds into DIR/0000, DIR/0001, ... (numbers
// going on from those already there), each incremental on the one before, a full one after every
// `full_every` incremental ones. One tool for the whole series: its CUDA context, pinned staging and
// checksum kernel are made once, so each dump after the first costs only its own copy and writes.
int dump_series(const dump_command_options& o, ckpt::dump_options options) {
  const fs::path dir = o.output.empty() ? fs::path("vmmckpt-" + std::to_string(o.pid) + "-series") : fs::path(o.output);
  int next = 0;
  if (!series_directory(dir, next))
    return report_failure("dump", o.json, dir.string() + ": cannot be created as the series' directory", exit_failure);
  options.copy.reuse = ckpt::make_copy_reuse();
  fs::path parent = o.parent;
  int chain = parent.empty() ? 0 : 1;  // images in the chain the next one would extend
  const std::atomic<int>& interrupt = catch_interrupts();
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; o.count == 0 || k < o.count; ++k) {
    const auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(o.every_s * k));
    if (!wait_until(due, interrupt)) break;
    char name[16];
    std::snprintf(name, sizeof name, "%04d", next);
    options.output = dir / name;
    options.copy.parent = chain > 0 && chain <= o.full_every ? parent : fs::path();
    options.copy.parent_in_process_image = ckpt::is_process_image_part(options.copy.parent);
    const auto result = dump_unless_ended(o.pid, options);
    if (!result) {
      if (!o.json) std::printf("process %d has ended: %d image(s) in %s\n", static_cast<int>(o.pid), k, dir.c_str());
      return exit_ok;
    }
    ++next;
    // The parent actually used: none when the series' last image changed since it was written.
    const fs::path used = result->manifest.parent ? options.copy.parent : fs::path();
    report_series_image(o, options, *result, used);
    chain = used.empty() ? 1 : chain + 1;
    parent = options.output;
  }
  if (const int sig = interrupt.load(); sig != 0) {
    if (!o.json)
      std::printf("stopped by %s between dumps; the images in %s are complete\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                  dir.c_str());
    return 128 + sig;
  }
  return exit_ok;
}

// The ways dump runs, one bit each: a rule names those it holds in.
enum dump_mode : unsigned { plain = 1, series = 2, job = 4, nodes = 8, process = 16 };
constexpr unsigned every_mode = plain | series | job | nodes | process;

// The sizes of --chunk, --staging and --pinned (0: auto), and which of them parse and fit.
struct copy_sizes {
  std::uint64_t chunk = 0, staging = 0, pinned = 0;
  bool chunk_ok = false, staging_ok = false, pinned_ok = false;
};

copy_sizes sizes_of(const dump_command_options& o) {
  copy_sizes s;
  s.chunk_ok = parse_size(o.chunk, s.chunk) && s.chunk >= (1u << 20) && s.chunk <= (1ULL << 30);
  s.staging_ok = o.staging == "auto" || (parse_size(o.staging, s.staging) && s.staging >= 2 * s.chunk);
  s.pinned_ok = o.pinned == "auto" || (parse_size(o.pinned, s.pinned) && s.pinned >= 2 * s.chunk);
  return s;
}

// A rule of dump's command line: in the modes it names, a command line that breaks it is refused with its
// message. Checked in this order; the first broken one is reported.
using command_line = const dump_command_options&;
struct usage_rule {
  unsigned modes;
  bool (*broken)(command_line);
  std::string (*message)(command_line);
};

const usage_rule usage_rules[] = {
    {nodes, [](command_line o) { return o.process || o.whole_job() || o.every_s > 0 || !o.parent.empty(); },
     [](command_line) -> std::string {
       return "--nodes names the job by its nodes' agents: --job, --ranks, --process, --every and --parent do not "
              "apply (docs/job-checkpoint.md, \"Across nodes\")";
     }},
    {nodes, [](command_line o) { return o.token_file.empty(); },
     [](command_line) -> std::string { return "--nodes needs --token-file, the job's secret its agents hold too"; }},
    {every_mode & ~nodes, [](command_line o) { return !o.token_file.empty(); },
     [](command_line) -> std::string { return "--token-file goes with --nodes"; }},
    {process, [](command_line o) { return o.every_s > 0; },
     [](command_line) -> std::string { return "--every does not apply to whole-process dumps (--process)"; }},
    {every_mode & ~process, [](command_line o) { return o.leave_running || o.pre_copy || !o.criu_args.empty(); },
     [](command_line) -> std::string {
       return "--leave-running, --pre-copy and --criu-arg apply to whole-process dumps (--process)";
     }},
    {every_mode & ~process,
     [](command_line o) { return o.every_s <= 0 && (o.count != 0 || o.full_every != default_full_every); },
     [](command_line) -> std::string { return "--count and --full-every apply to a series of dumps (--every)"; }},
    {every_mode & ~process, [](command_line o) { return !sizes_of(o).chunk_ok; },
     [](command_line o) { return "--chunk must be a size from 1M to 1G, not '" + o.chunk + "'"; }},
    {every_mode & ~process, [](command_line o) { return !sizes_of(o).staging_ok; },
     [](command_line o) {
       return "--staging must be 'auto' or a size of at least two chunks, not '" + o.staging + "'";
     }},
    {every_mode & ~process, [](command_line o) { return !sizes_of(o).pinned_ok; },
     [](command_line o) { return "--pinned must be 'auto' or a size of at least two chunks, not '" + o.pinned + "'"; }},
    {every_mode & ~process,
     [](command_line o) {
       const copy_sizes s = sizes_of(o);
       return s.staging != 0 && s.pinned > s.staging;
     },
     [](command_line o) { return "--pinned " + o.pinned + " is more than --staging " + o.staging; }},
    {job, [](command_line o) { return o.every_s > 0 || !o.parent.empty(); },
     [](command_line) -> std::string { return "--every and --parent do not apply to a job's dump (--job, --ranks)"; }},
};

// The message of the first rule the command line breaks in `mode`; none when it breaks none.
std::optional<std::string> refusal(const dump_command_options& o, dump_mode mode) {
  for (const auto& rule : usage_rules)
    if ((rule.modes & mode) != 0 && rule.broken(o)) return rule.message(o);
  return std::nullopt;
}

// What the dump engine is asked for, from a command line that breaks no rule.
ckpt::dump_options dump_options_of(const dump_command_options& o) {
  const copy_sizes sizes = sizes_of(o);
  ckpt::dump_options options;
  options.pid = o.pid;
  options.output =
      o.output.empty() ? fs::path("vmmckpt-" + std::to_string(o.pid) + "-" + time_stamp()) : fs::path(o.output);
  options.copy.chunk_bytes = sizes.chunk;
  options.copy.staging_bytes = sizes.staging;
  options.copy.pinned_bytes = sizes.pinned;
  options.copy.streams = o.streams;
  if (o.writers > 0) options.copy.writers = o.writers;
  options.gpu_snapshot = !o.no_gpu_snapshot;
  options.allow_partial = o.allow_partial;
  options.copy.parent = o.parent;
  options.copy.parent_in_process_image = ckpt::is_process_image_part(o.parent);
  options.copy.gpu_checksums = !o.cpu_checksums;
  options.hold_deadline = o.hold_deadline;
  options.copy.interrupt = &catch_interrupts();
  return options;
}

// One dump of one process: the plain mode.
int dump_once(const dump_command_options& o) {
  progress_line line("dump", !o.json);
  const auto result = ckpt::dump(dump_options_of(o), line.callback());
  line.finish();
  if (o.json)
    std::cout << result_json(o, result, o.parent).dump(2) << "\n";
  else
    print_result(o, result, o.parent);
  return exit_ok;
}

// Dump's modes: the first whose `chosen` holds is the command line's, and `run` carries it out.
struct mode_row {
  dump_mode mode;
  bool (*chosen)(command_line);
  int (*run)(command_line);
};

const mode_row mode_rows[] = {
    {nodes, [](command_line o) { return !o.nodes.empty(); },
     [](command_line o) { return dump_nodes_command(o, dump_options_of(o).copy); }},
    {process, [](command_line o) { return o.process; }, dump_process_command},
    {job, [](command_line o) { return o.whole_job(); },
     [](command_line o) { return dump_job_command(o, dump_options_of(o).copy); }},
    {series, [](command_line o) { return o.every_s > 0; },
     [](command_line o) { return dump_series(o, dump_options_of(o)); }},
    {plain, [](command_line) { return true; }, dump_once},
};

// dump --help's footer: the forms of the command and what each does.
const char* const dump_footer =
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
    "Whole process: cuda-ckpt dump PID --process -o DIR [--leave-running] [--pre-copy]\n"
    "Each process of PID's tree under vmmckpt is suspended into DIR/gpu/PID (its GPU memory copied out and\n"
    "freed), the driver checkpoints what is left of its CUDA context, and `criu dump` writes the CPU side\n"
    "into DIR/criu; process.json lists and checksums both parts. DIR appears only once complete. A failure at\n"
    "any step brings the processes back running and leaves no image; if cuda-ckpt itself is killed midway,\n"
    "`cuda-ckpt resume PID` brings the process back from whatever state it was left in. The time the process\n"
    "was stopped is reported. With --pre-copy each GPU part is dumped first while the process runs\n"
    "(DIR/gpu/PID.pre) and DIR/gpu/PID holds only the blocks changed since.\n"
    "CRIU: $VMMCKPT_CRIU, else criu on PATH (scripts/provision-criu.sh).\n"
    "\n"
    "Whole job: cuda-ckpt dump --job PID -o DIR   (or --ranks PID,PID,...)\n"
    "Every process under vmmckpt in PID's tree (PID: torchrun, mpirun, a Slurm step) is brought to one point\n"
    "of the job first: each NCCL call waits once the process has issued as many operations on each\n"
    "communicator as the rank furthest on, so no collective is left half issued. Then every rank is held and\n"
    "copied out as above, and all are released together once every rank's bytes are safe. DIR holds job.json\n"
    "and one image per rank (DIR/PID). A rank that does not reach the cut within --deadline is named, with\n"
    "where it was, and every rank goes on. With --process, the whole job through CRIU (docs/job-checkpoint.md).";

// How the bytes are copied out of the program: the staging and the streams.
void add_copy_options(CLI::App* command, dump_command_options& o) {
  command->add_option("--chunk", o.chunk, "Staging buffer size, 1M to 1G (K/M/G suffixes)")
      ->capture_default_str()
      ->type_name("SIZE");
  command
      ->add_option("--staging", o.staging,
                   "Most host memory that takes the program's bytes while it is held (K/M/G/T suffixes): pinned "
                   "buffers (1G of them with auto), then ordinary memory. A dump that fits is held only until its "
                   "bytes are in host memory; auto: half the memory available")
      ->capture_default_str()
      ->type_name("SIZE");
  command
      ->add_option("--pinned", o.pinned,
                   "The most of the staging that is pinned (K/M/G/T suffixes): pinning costs time before the hold, "
                   "and copies into pinned memory run at the bus's speed. auto: 1G (or all of a smaller --staging)")
      ->capture_default_str()
      ->type_name("SIZE");
  command->add_option("--streams", o.streams, "Copy streams")->capture_default_str()->check(CLI::Range(1, 16));
  command->add_flag("--no-gpu-snapshot", o.no_gpu_snapshot,
                    "Hold the program until its memory is on the host, even when the GPU has room for a copy");
}

// What the image holds: all of the memory or not, all of the bytes or those changed since a parent.
void add_image_options(CLI::App* command, dump_command_options& o) {
  command->add_flag("--allow-partial", o.allow_partial,
                    "Write the image even when the process has device memory vmmckpt does not own (managed memory, "
                    "CUDA arrays, memory pools it created, VMM that passes through): the image is marked partial "
                    "and lists what it lacks");
  command
      ->add_option("--parent", o.parent,
                   "Write an incremental image: blocks unchanged since the image PARENT are left to it (it must "
                   "stay, or be merged: cuda-ckpt merge). With --process, PARENT is a whole-process image and each "
                   "process's GPU part is incremental on its part there")
      ->type_name("IMAGE");
}

// How the image is written: where the checksums are computed, and by how many threads.
void add_writing_options(CLI::App* command, dump_command_options& o) {
  command->add_flag("--cpu-checksums", o.cpu_checksums,
                    "Compute the block checksums on the CPU, as the writers write. By default a kernel built into "
                    "cuda-ckpt computes them on the GPU: all of them for an incremental dump (which then copies only "
                    "changed blocks out of the GPU), those of the GPU snapshot for a full one; where it cannot, the "
                    "CPU does, and --json says why (checksums.why_not_gpu)");
  command
      ->add_option("--writers", o.writers,
                   "Threads writing the image, one data file each (default: one per core, up to 16)")
      ->check(CLI::Range(1, 256));
}

// A series of dumps (--every).
void add_series_options(CLI::App* command, dump_command_options& o) {
  command
      ->add_option("--every", o.every_s,
                   "A series: one dump now and one every SECONDS into DIR/0000, DIR/0001, ..., each incremental on "
                   "the one before (one line, or with --json one JSON line, per image); ends when the process does, "
                   "after --count dumps, or at SIGINT/SIGTERM")
      ->check(CLI::Range(0.001, 1e7))
      ->type_name("SECONDS");
  command->add_option("--count", o.count, "With --every: stop after this many dumps (default: no limit)")
      ->check(CLI::Range(1, 1000000));
  command
      ->add_option("--full-every", o.full_every,
                   "With --every: a full image after this many incremental ones (bounds the chains restore reads)")
      ->capture_default_str()
      ->check(CLI::Range(0, 30));
}

// Whole-process dumps (--process), through CRIU.
void add_process_options(CLI::App* command, dump_command_options& o) {
  command->add_flag("--process", o.process,
                    "The whole process and its descendants, CPU side too (CRIU 4.0 or later, the driver's checkpoint "
                    "API): `cuda-ckpt restore DIR` brings it back. The process ends when the dump completes");
  command->add_flag("--leave-running", o.leave_running,
                    "With --process: the process goes on afterwards (periodic checkpoints)");
  command->add_flag("--pre-copy", o.pre_copy,
                    "With --process: first dump the GPU memory while the process runs, then stop it only for the "
                    "blocks changed since, the driver's checkpoint and CRIU");
  command
      ->add_option("--criu-arg", o.criu_args,
                   "With --process: one more argument for `criu dump` (repeatable; e.g. --criu-arg=--tcp-established)")
      ->type_name("ARG")
      ->allow_extra_args(false);
}

}  // namespace

int dump_command(const dump_command_options& o) {
  const mode_row& row =
      *std::find_if(std::begin(mode_rows), std::end(mode_rows), [&](const mode_row& r) { return r.chosen(o); });
  if (const auto message = refusal(o, row.mode)) return report_failure("dump", o.json, *message, exit_usage);
  return row.run(o);
}

subcommand add_dump(CLI::App& app) {
  auto o = std::make_shared<dump_command_options>();
  auto* command = app.add_subcommand("dump", "Write a consistent image of a running process's GPU memory");
  add_held_image(command, *o, "Image directory to create (default ./vmmckpt-PID-TIME; also -D DIR)",
                 "Give up after this many whole seconds (1 to 3600), connecting and preparing included; the "
                 "program is released by then, dump or not");
  add_copy_options(command, *o);
  add_image_options(command, *o);
  add_writing_options(command, *o);
  add_series_options(command, *o);
  add_process_options(command, *o);
  command->footer(dump_footer);
  return {command, [o] { return dump_command(*o); }};
}

}  // namespace vmmckpt::tools
