// `cuda-ckpt dump`: parse options, run the dump engine, report.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/dump.hpp"
#include "vmmckpt/pool_layout.hpp"

namespace vmmckpt::tools {

int dump_command(const dump_command_options& o) {
  if (o.process) return dump_process_command(o);
  if (o.leave_running || !o.criu_args.empty())
    return report_failure("dump", o.json, "--leave-running and --criu-arg apply to whole-process dumps (--process)",
                          exit_usage);
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

  progress_line line("dump", !o.json);
  const auto result = ckpt::dump(options, line.callback());
  line.finish();

  std::size_t allocations = 0;
  for (const auto& pool : result.manifest.pools) allocations += pool.allocations.size();
  const double gbps = result.seconds > 0 ? static_cast<double>(result.manifest.data_bytes) / result.seconds / 1e9 : 0;
  const double copy_gbps =
      result.copy_seconds > 0 ? static_cast<double>(result.manifest.data_bytes) / result.copy_seconds / 1e9 : 0;
  if (o.json) {
    nlohmann::json out = {{"image", result.image.string()},  {"pid", o.pid},
                          {"bytes", result.manifest.data_bytes}, {"allocations", allocations},
                          {"seconds", result.seconds},        {"gb_per_s", gbps},
                          {"copy_seconds", result.copy_seconds}, {"copy_gb_per_s", copy_gbps},
                          {"hold_ms", result.hold_ms},        {"gpu_snapshot", result.gpu_snapshot},
                          {"gpu_snapshot_bytes", result.snapshot_bytes},
                          {"data_files", result.manifest.data_files},
                          {"parent", o.parent.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.parent)},
                          {"unchanged_bytes", result.unchanged_bytes},
                          {"lacking", kinds_and_sizes_json(result.manifest.lacking)}};
    out.update(timings_json(result));
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("dumped %s in %zu allocations of process %d to %s\n",
                human_bytes(result.manifest.data_bytes).c_str(), allocations, static_cast<int>(o.pid),
                result.image.c_str());
    std::printf("  %.3f s in all (%.2f GB/s); program held %.1f ms while its memory was copied %s in %.3f s (%.2f GB/s)\n",
                result.seconds, gbps, result.hold_ms, !result.gpu_snapshot ? "out of the GPU"
                : result.snapshot_bytes < result.manifest.data_bytes ? "partly to spare GPU memory, partly out of the GPU"
                                                                     : "to spare GPU memory",
                result.copy_seconds, copy_gbps);
    if (!o.parent.empty())
      std::printf("  incremental: %s unchanged since %s, left to it\n", human_bytes(result.unchanged_bytes).c_str(),
                  o.parent.c_str());
    if (!result.manifest.lacking.empty())
      std::printf("  partial: the image lacks %s (memory vmmckpt does not own)\n",
                  kinds_and_sizes(result.manifest.lacking).c_str());
  }
  return exit_ok;
}

}  // namespace vmmckpt::tools
