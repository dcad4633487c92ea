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
#include "vmmckpt/ckpt/driver_checkpoint.hpp"
#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/image/image.hpp"

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
  options.output =
      o.output.empty() ? "vmmckpt-job-" + std::to_string(name_of_job(o, o.pid)) + "-" + time_stamp() : o.output;
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
    std::cout
        << nlohmann::json{{"image", r.image.string()},    {"ranks", ranks_json(r.ranks, each)}, {"bytes", bytes},
                          {"cut_seconds", r.cut.seconds}, {"cut_rounds", r.cut.rounds},         {"held_ms", r.held_ms},
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
  options.output = o.output.empty() ? ckpt::default_suspend_dir() /
                                          ("job-" + std::to_string(name_of_job(o, o.pid)) + "-" + time_stamp())
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
              static_cast<int>(name_of_job(o, o.pid)), r.ranks.size(), r.seconds, human_bytes(r.freed_bytes).c_str(),
              r.image.c_str(), human_bytes(bytes).c_str());
  print_cut(r.cut, held_ms);
  std::printf("  still in use on the ranks' devices: %s (their CUDA contexts, memory vmmckpt does not serve, other "
              "processes)\n",
              human_bytes(used_after).c_str());
  std::printf("  the job's threads wait until `cuda-ckpt resume --job %s`\n",
              o.ranks.empty() ? std::to_string(o.pid).c_str()
                              : ("--ranks " + std::to_string(o.ranks.front()) + ",...").c_str());
  return exit_ok;
}

int resume_job_command(const job_command_options& o, pid_t pid, bool json, std::chrono::seconds resume_deadline) {
  // A whole job's dump stopped midway may have left its processes stopped (CRIU's --leave-stopped), locked or
  // checkpointed by the driver: undone first, in that order, for every process of the job (a stopped process
  // answers nothing).
  for (const pid_t p : o.ranks.empty() ? ckpt::process_tree(pid) : o.ranks) {
    for (const std::string& done : {ckpt::continue_stopped_by_dump(p), ckpt::recover_driver_state(p)})
      if (!done.empty() && !json) std::printf("process %d: %s\n", static_cast<int>(p), done.c_str());
  }
  const auto r = ckpt::resume_job(spec_of(o, pid), {}, resume_deadline);
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
    std::cout << nlohmann::json{{"ranks", ranks_json(r.ranks, each)}, {"bytes", r.bytes}, {"seconds", r.seconds}}.dump(
                     2)
              << "\n";
    return exit_ok;
  }
  std::printf("resumed the job of process %d (%zu ranks): %s back in %.3f s\n", static_cast<int>(name_of_job(o, pid)),
              r.ranks.size(), human_bytes(r.bytes).c_str(), r.seconds);
  return exit_ok;
}

int inspect_job_command(const std::string& image, bool json) {
  const auto j = ckpt::read_job_image(image);
  // Each rank's image opens with every rule checked (nothing of its data is read).
  std::vector<image::manifest> ranks;
  for (const auto& r : j.ranks) ranks.push_back(image::reader::open(j.rank_image(image, r.pid)).info());
  std::uint64_t bytes = 0;
  for (const auto& m : ranks) bytes += m.data_bytes;
  if (json) {
    nlohmann::json out = job_image_json(image, j);
    out["root_pid"] = j.root_pid;
    out["bytes"] = bytes;
    out["ranks"] = nlohmann::json::array();
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      nlohmann::json devices = nlohmann::json::array();
      for (const auto& d : ranks[i].devices)
        devices.push_back({{"ordinal", d.ordinal}, {"name", d.name}, {"uuid", d.uuid}});
      out["ranks"].push_back({{"pid", j.ranks[i].pid},
                              {"image", j.rank_image(image, j.ranks[i].pid).string()},
                              {"image_id", j.ranks[i].image_id},
                              {"bytes", ranks[i].data_bytes},
                              {"devices", devices},
                              {"command", ranks[i].command}});
    }
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  std::printf("image     %s: a job's image (%s, written by vmmckpt %s)\n", shown(image).c_str(),
              j.kind == "suspend" ? "suspend --job" : "dump --job", shown(j.tool_version).c_str());
  std::printf("created   %s on %s; %zu ranks cut at one point in %.1f ms (%d round%s), held at most %.1f ms\n",
              shown(j.created).c_str(), shown(j.host).c_str(), j.ranks.size(), j.cut_seconds * 1000, j.cut_rounds,
              j.cut_rounds == 1 ? "" : "s", j.held_ms);
  std::printf("data      %s in all\n", human_bytes(bytes).c_str());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    std::string devices;
    for (const auto& d : ranks[i].devices)
      devices += (devices.empty() ? "" : ", ") + std::to_string(d.ordinal) + " (" + shown(d.name) + ")";
    std::printf("  rank process %d: %s on GPU %s; %s\n", static_cast<int>(j.ranks[i].pid),
                human_bytes(ranks[i].data_bytes).c_str(), devices.c_str(), shown_command(ranks[i].command).c_str());
  }
  return exit_ok;
}

int verify_job_command(const std::string& image, bool json) {
  const auto j = ckpt::read_job_image(image);
  ckpt::verify_job_image(image, j, true);
  if (json)
    std::cout << nlohmann::json{{"image", image}, {"ok", true}, {"job", true}}.dump(2) << "\n";
  else
    std::printf("%s: good (a job's image: %zu ranks, every checksum matches)\n", shown(image).c_str(), j.ranks.size());
  return exit_ok;
}

}  // namespace vmmckpt::tools
