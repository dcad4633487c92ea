// `cuda-ckpt dump --job`, `suspend --job` and `resume --job`: a whole multi-rank job, its ranks cut at one point.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/leftovers.hpp"

namespace vmmckpt::tools {
namespace {

ckpt::job_spec spec_of(const job_command_options& o, pid_t pid) { return {o.ranks.empty() ? pid : 0, o.ranks}; }

// How the job is named in messages and default image names: its launcher, or its first rank.
pid_t name_of_job(const job_command_options& o, pid_t pid) { return o.ranks.empty() ? pid : o.ranks.front(); }

nlohmann::json ranks_json(const std::vector<pid_t>& ranks, const std::vector<nlohmann::json>& each) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    nlohmann::json r = each[i];
    r["pid"] = ranks[i];
    out.push_back(std::move(r));
  }
  return out;
}

void print_cut(const ckpt::cut_figures& cut, double held_ms) {
  std::printf("  the cut: %.1f ms to bring every rank to one point (%d round%s); ranks held at most %.1f ms\n",
              cut.seconds * 1000, cut.rounds, cut.rounds == 1 ? "" : "s", held_ms);
}

}  // namespace

int dump_job_command(const dump_command_options& o, const ckpt::copy_settings& copy) {
  ckpt::job_dump_options options;
  options.job = spec_of(o, o.pid);
  options.output = o.output.empty() ? "vmmckpt-job-" + std::to_string(name_of_job(o, o.pid)) + "-" + time_stamp()
                                    : o.output;
  options.copy = copy;
  options.hold_deadline = o.hold_deadline;
  options.gpu_snapshot = !o.no_gpu_snapshot;
  options.allow_partial = o.allow_partial;
  const auto r = ckpt::dump_job(options);
  std::uint64_t bytes = 0;
  std::vector<nlohmann::json> each;
  for (const auto& d : r.dumps) {
    bytes += d.manifest.data_bytes;
    each.push_back({{"image", d.image.filename().string()},
                    {"bytes", d.manifest.data_bytes},
                    {"zero_bytes", d.zero_bytes},
                    {"hold_ms", d.hold_ms},
                    {"gpu_snapshot", d.gpu_snapshot}});
  }
  if (o.json) {
    std::cout << nlohmann::json{{"image", r.image.string()},   {"ranks", ranks_json(r.ranks, each)},
                                {"bytes", bytes},              {"cut_seconds", r.cut.seconds},
                                {"cut_rounds", r.cut.rounds},  {"held_ms", r.held_ms},
                                {"seconds", r.seconds}}
                     .dump(2)
              << "\n";
    return exit_ok;
  }
  std::printf("dumped the job of process %d (%zu ranks, %s of GPU memory) to %s in %.3f s\n",
              static_cast<int>(name_of_job(o, o.pid)), r.ranks.size(), human_bytes(bytes).c_str(), r.image.c_str(),
              r.seconds);
  print_cut(r.cut, r.held_ms);
  for (std::size_t i = 0; i < r.ranks.size(); ++i)
    std::printf("  rank process %d: %s, held %.1f ms\n", static_cast<int>(r.ranks[i]),
                human_bytes(r.dumps[i].manifest.data_bytes).c_str(), r.dumps[i].hold_ms);
  return exit_ok;
}

int suspend_job_command(const suspend_command_options& o, const ckpt::copy_settings& copy) {
  ckpt::job_suspend_options options;
  options.job = spec_of(o, o.pid);
  options.output = o.output.empty() ? ckpt::default_suspend_dir() / ("job-" + std::to_string(name_of_job(o, o.pid)) +
                                                                     "-" + time_stamp())
                                    : std::filesystem::path(o.output);
  options.copy = copy;
  options.hold_deadline = o.hold_deadline;
  options.verify = o.verify;
  options.allow_partial = o.allow_partial;
  const auto r = ckpt::suspend_job(options);
  std::uint64_t bytes = 0, used_after = 0;
  double held_ms = 0;
  std::vector<nlohmann::json> each;
  for (const auto& s : r.suspends) {
    bytes += s.manifest.data_bytes;
    used_after += s.device_used_after;
    held_ms = std::max(held_ms, s.hold_ms);
    each.push_back({{"image", s.image.filename().string()},
                    {"bytes", s.manifest.data_bytes},
                    {"freed_bytes", s.freed_bytes},
                    {"late", s.late}});
  }
  if (o.json) {
    std::cout << nlohmann::json{{"image", r.image.string()},
                                {"ranks", ranks_json(r.ranks, each)},
                                {"bytes", bytes},
                                {"freed_bytes", r.freed_bytes},
                                {"cut_seconds", r.cut.seconds},
                                {"cut_rounds", r.cut.rounds},
                                {"seconds", r.seconds}}
                     .dump(2)
              << "\n";
    return exit_ok;
  }
  std::printf("suspended the job of process %d (%zu ranks) in %.3f s: %s of GPU memory freed, image %s (%s)\n",
              static_cast<int>(name_of_job(o, o.pid)), r.ranks.size(), r.seconds,
              human_bytes(r.freed_bytes).c_str(), r.image.c_str(), human_bytes(bytes).c_str());
  print_cut(r.cut, held_ms);
  std::printf("  still in use on the ranks' devices: %s (their CUDA contexts, memory vmmckpt does not serve, other "
              "processes)\n",
              human_bytes(used_after).c_str());
  std::printf("  the job's threads wait until `cuda-ckpt resume --job %s`\n",
              o.ranks.empty() ? std::to_string(o.pid).c_str() : ("--ranks " + std::to_string(o.ranks.front()) + ",...").c_str());
  return exit_ok;
}

int resume_job_command(const job_command_options& o, pid_t pid, bool json) {
  const auto r = ckpt::resume_job(spec_of(o, pid));
  // A job image in the default place has served its purpose; one the user named stays.
  const std::string prefix = (ckpt::suspend_dir_of(::geteuid()) / "job-").string();
  for (const auto& x : r.resumes) {
    const std::string dir = std::filesystem::path(x.image).parent_path().string();
    if (dir.rfind(prefix, 0) == 0) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  if (json) {
    std::vector<nlohmann::json> each;
    for (const auto& x : r.resumes) each.push_back({{"bytes", x.bytes}, {"seconds", x.seconds}, {"image", x.image}});
    std::cout << nlohmann::json{{"ranks", ranks_json(r.ranks, each)}, {"bytes", r.bytes}, {"seconds", r.seconds}}.dump(2)
              << "\n";
    return exit_ok;
  }
  std::printf("resumed the job of process %d (%zu ranks): %s back in %.3f s\n", static_cast<int>(name_of_job(o, pid)),
              r.ranks.size(), human_bytes(r.bytes).c_str(), r.seconds);
  return exit_ok;
}

}  // namespace vmmckpt::tools
