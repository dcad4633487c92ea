// `cuda-ckpt dump`: parse options, run the dump engine, report.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/dump.hpp"
#include "vmmckpt/ckpt/processes.hpp"
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
  const auto bytes = static_cast<double>(result.manifest.data_bytes + result.unchanged_bytes);
  if (result.seconds > 0) f.gbps = bytes / result.seconds / 1e9;
  if (result.copy_seconds > 0) f.copy_gbps = bytes / result.copy_seconds / 1e9;
  return f;
}

nlohmann::json result_json(const dump_command_options& o, const ckpt::dump_result& result, const fs::path& parent) {
  const dump_figures f = figures_of(result);
  nlohmann::json out = {{"image", result.image.string()},  {"pid", o.pid},
                        {"bytes", result.manifest.data_bytes}, {"allocations", f.allocations},
                        {"seconds", result.seconds},        {"gb_per_s", f.gbps},
                        {"copy_seconds", result.copy_seconds}, {"copy_gb_per_s", f.copy_gbps},
                        {"hold_ms", result.hold_ms},        {"gpu_snapshot", result.gpu_snapshot},
                        {"gpu_snapshot_bytes", result.snapshot_bytes},
                        {"data_files", result.manifest.data_files},
                        {"parent", parent.empty() ? nlohmann::json(nullptr) : nlohmann::json(parent.string())},
                        {"unchanged_bytes", result.unchanged_bytes},
                        {"lacking", kinds_and_sizes_json(result.manifest.lacking)}};
  out.update(timings_json(result));
  return out;
}

void print_result(const dump_command_options& o, const ckpt::dump_result& result, const fs::path& parent) {
  const dump_figures f = figures_of(result);
  std::printf("dumped %s in %zu allocations of process %d to %s\n", human_bytes(result.manifest.data_bytes).c_str(),
              f.allocations, static_cast<int>(o.pid), result.image.c_str());
  std::printf("  %.3f s in all (%.2f GB/s); program held %.1f ms while its memory was copied %s in %.3f s (%.2f GB/s)\n",
              result.seconds, f.gbps, result.hold_ms, !result.gpu_snapshot ? "out of the GPU"
              : result.snapshot_bytes < result.manifest.data_bytes ? "partly to spare GPU memory, partly out of the GPU"
                                                                   : "to spare GPU memory",
              result.copy_seconds, f.copy_gbps);
  if (!parent.empty())
    std::printf("  incremental: %s unchanged since %s, left to it\n", human_bytes(result.unchanged_bytes).c_str(),
                parent.c_str());
  if (!result.manifest.lacking.empty())
    std::printf("  partial: the image lacks %s (memory vmmckpt does not own)\n",
                kinds_and_sizes(result.manifest.lacking).c_str());
  std::fflush(stdout);
}

// dump --every: one image now and one every `every_s` seconds into DIR/0000, DIR/0001, ... (numbers
// going on from those already there), each incremental on the one before, a full one after every
// `full_every` incremental ones. One tool for the whole series: its CUDA context, pinned staging and
// checksum kernel are made once, so each dump after the first costs only its own copy and writes.
int dump_series(const dump_command_options& o, ckpt::dump_options options) {
  const fs::path dir = o.output.empty() ? fs::path("vmmckpt-" + std::to_string(o.pid) + "-series") : fs::path(o.output);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec))
    return report_failure("dump", o.json, dir.string() + ": cannot be created as the series' directory", exit_failure);
  int next = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name.size() <= 9 && name.find_first_not_of("0123456789") == std::string::npos)
      next = std::max(next, std::stoi(name) + 1);
  }
  options.copy.reuse = ckpt::make_copy_reuse();
  fs::path parent = o.parent;
  int chain = parent.empty() ? 0 : 1;  // images in the chain the next one would extend
  const std::atomic<int>& interrupt = catch_interrupts();
  auto ended = [&](int images) {
    if (!o.json) std::printf("process %d has ended: %d image(s) in %s\n", static_cast<int>(o.pid), images, dir.c_str());
    return static_cast<int>(exit_ok);
  };
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; o.count == 0 || k < o.count; ++k) {
    const auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(o.every_s * k));
    while (std::chrono::steady_clock::now() < due && interrupt.load() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (interrupt.load() != 0) break;
    if (!ckpt::process_alive(o.pid)) {
      return ended(k);
    }
    char name[16];
    std::snprintf(name, sizeof name, "%04d", next++);
    options.output = dir / name;
    options.copy.parent = chain > 0 && chain <= o.full_every ? parent : fs::path();
    ckpt::dump_result result;
    try {
      result = ckpt::dump(options);
    } catch (const ckpt::interrupted&) {
      throw;
    } catch (const std::exception&) {
      // A program that is ending (its CUDA teardown can take a while) fails the dump: give it a moment.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (ckpt::process_alive(o.pid) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (ckpt::process_alive(o.pid)) throw;
      return ended(k);
    }
    // The parent actually used: none when the series' last image changed since it was written.
    const fs::path used = result.manifest.parent ? options.copy.parent : fs::path();
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
    chain = used.empty() ? 1 : chain + 1;
    parent = options.output;
  }
  if (const int sig = interrupt.load(); sig != 0) {
    if (!o.json) std::printf("stopped by %s between dumps; the images in %s are complete\n",
                             sig == SIGINT ? "SIGINT" : "SIGTERM", dir.c_str());
    return 128 + sig;
  }
  return exit_ok;
}

}  // namespace

int dump_command(const dump_command_options& o) {
  if (o.process) {
    if (o.every_s > 0) return report_failure("dump", o.json, "--every does not apply to whole-process dumps (--process)", exit_usage);
    return dump_process_command(o);
  }
  if (o.leave_running || !o.criu_args.empty())
    return report_failure("dump", o.json, "--leave-running and --criu-arg apply to whole-process dumps (--process)",
                          exit_usage);
  if (o.every_s <= 0 && (o.count != 0 || o.full_every != default_full_every))
    return report_failure("dump", o.json, "--count and --full-every apply to a series of dumps (--every)", exit_usage);
  ckpt::dump_options options;
  options.pid = o.pid;
  if (o.output.empty()) {
    options.output = "vmmckpt-" + std::to_string(o.pid) + "-" + time_stamp();
  } else {
    options.output = o.output;
  }
  std::uint64_t chunk = 0;
  if (!parse_size(o.chunk, chunk) || chunk < (1u << 20) || chunk > (1ULL << 30))
    return report_failure("dump", o.json, "--chunk must be a size from 1M to 1G, not '" + o.chunk + "'", exit_usage);
  options.copy.chunk_bytes = chunk;
  std::uint64_t staging = 0;
  if (!parse_size(o.staging, staging) || staging < 2 * chunk)
    return report_failure("dump", o.json, "--staging must be a size of at least two chunks, not '" + o.staging + "'",
                          exit_usage);
  options.copy.staging_bytes = staging;
  options.copy.streams = o.streams;
  if (o.writers > 0) options.copy.writers = o.writers;
  options.gpu_snapshot = !o.no_gpu_snapshot;
  options.allow_partial = o.allow_partial;
  options.copy.parent = o.parent;
  options.copy.gpu_checksums = !o.cpu_checksums;
  options.hold_deadline_ms = o.deadline_s * 1000;

  options.copy.interrupt = &catch_interrupts();
  if (o.every_s > 0) return dump_series(o, options);

  progress_line line("dump", !o.json);
  const auto result = ckpt::dump(options, line.callback());
  line.finish();
  if (o.json)
    std::cout << result_json(o, result, o.parent).dump(2) << "\n";
  else
    print_result(o, result, o.parent);
  return exit_ok;
}

}  // namespace vmmckpt::tools
