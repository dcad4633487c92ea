// `cuda-ckpt dump --process` and `cuda-ckpt restore DIR`: the whole process, CPU side through CRIU.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"
#include "vmmckpt/restore/tool/process_restore.hpp"

namespace vmmckpt::tools {
namespace {

nlohmann::json pids_json(const ckpt::process_image& d) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : d.processes) out.push_back(m.pid);
  return out;
}

}  // namespace

int dump_process_command(const dump_command_options& o) {
  if (!o.ranks.empty())
    return report_failure("dump", o.json,
                          "--process takes a process tree: name the job by its launcher (--job PID), not --ranks",
                          exit_usage);
  ckpt::process_dump_options options;
  options.pid = o.pid;
  options.output = o.output;
  if (o.output.empty()) {
    options.output = "vmmckpt-process-" + std::to_string(o.pid) + "-" + time_stamp();
  }
  options.leave_running = o.leave_running;
  options.criu_args = o.criu_args;
  options.hold_deadline = o.hold_deadline;
  if (o.writers > 0) options.copy.writers = o.writers;
  options.copy.gpu_checksums = !o.cpu_checksums;
  options.parent = o.parent;
  options.pre_copy = o.pre_copy;
  options.job = o.job;
  options.copy.interrupt = &catch_interrupts();
  progress_line line("dump", !o.json);
  const auto r = ckpt::dump_process(options, line.callback());
  line.finish();
  const auto& d = r.description;
  if (o.json) {
    std::cout << nlohmann::json{{"image", r.image.string()},
                                {"pid", o.pid},
                                {"processes", pids_json(d)},
                                {"gpu_bytes", d.gpu_bytes},
                                {"left_running", d.left_running},
                                {"stopped_seconds", d.stopped_seconds},
                                {"seconds", r.seconds},
                                {"criu_version", d.criu_version},
                                {"phases", phases_json(r.phases)},
                                {"parent", d.parent},
                                {"pre_copied", d.pre_copied()},
                                {"job", d.job},
                                {"pre_copy_bytes", r.pre_copy_bytes},
                                {"pre_copy_held_ms", r.pre_copy_held_ms},
                                {"held_bytes", r.held_bytes}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("dumped %s %d whole (%zu under vmmckpt, %s of GPU memory written; CRIU %s) to %s in %.3f s\n",
                d.job ? "the job of process" : "process", static_cast<int>(o.pid), d.processes.size(),
                human_bytes(d.gpu_bytes).c_str(), d.criu_version.c_str(), r.image.c_str(), r.seconds);
    if (d.pre_copied())
      std::printf("  pre-copied %s of GPU memory while it ran (held at most %.1f ms); the stop wrote %s changed "
                  "since\n",
                  human_bytes(r.pre_copy_bytes).c_str(), r.pre_copy_held_ms, human_bytes(r.held_bytes).c_str());
    std::printf("  the process was stopped for %.3f s; %s\n", d.stopped_seconds,
                d.left_running ? "it goes on" : "it has ended, as with criu dump");
    if (!d.parent.empty())
      std::printf("  incremental on %s: its GPU parts hold only the blocks changed since\n", d.parent.c_str());
    std::printf("  restore it with: cuda-ckpt restore %s\n", r.image.c_str());
  }
  return exit_ok;
}

int inspect_process_command(const std::string& image, bool json) {
  // Its structure is checked, as a GPU image's is: the layout and each CRIU file's size (nothing is read).
  const auto d = ckpt::read_process_image(image);
  ckpt::check_process_layout(image, d);
  ckpt::verify_criu_files(image, d, false);
  if (json) {
    nlohmann::json out{{"image", image},
                       {"whole_process", true},
                       {"root_pid", d.root_pid},
                       {"created", d.created},
                       {"host", d.host},
                       {"tool_version", d.tool_version},
                       {"criu_version", d.criu_version},
                       {"gpu_bytes", d.gpu_bytes},
                       {"left_running", d.left_running},
                       {"stopped_seconds", d.stopped_seconds},
                       {"parent", d.parent},
                       {"job", d.job}};
    out["processes"] = nlohmann::json::array();
    for (const auto& m : d.processes)
      out["processes"].push_back(
          {{"pid", m.pid},
           {"parent", m.parent},
           {"command", m.command},
           {"gpu_image", d.gpu_image(image, m.pid).string()},
           {"pre_copy_image", m.pre_copy_image_id.empty() ? std::string() : d.pre_copy_image(image, m.pid).string()},
           {"driver_checkpointed", m.driver_checkpointed}});
    std::uint64_t cpu_bytes = 0;
    for (const auto& f : d.criu_files) cpu_bytes += f.bytes;
    out["cpu_bytes"] = cpu_bytes;
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  std::uint64_t cpu_bytes = 0;
  for (const auto& f : d.criu_files) cpu_bytes += f.bytes;
  // What the image says of itself is shown escaped: a command line is the program's choice, and the image
  // may be another user's.
  std::printf("image     %s: a whole-process image (written by vmmckpt %s, CRIU %s)\n", shown(image).c_str(),
              shown(d.tool_version).c_str(), shown(d.criu_version).c_str());
  std::printf("created   %s on %s; the process was stopped %.3f s%s\n", shown(d.created).c_str(), shown(d.host).c_str(),
              d.stopped_seconds, d.left_running ? " and went on" : " and ended");
  if (!d.parent.empty())
    std::printf("parent    %s (its GPU parts are incremental on that image's; it must stay)\n",
                shown(d.parent).c_str());
  std::printf("cpu part  %s in %zu CRIU files (%s/)\n", human_bytes(cpu_bytes).c_str(), d.criu_files.size(),
              ckpt::criu_dir_name);
  std::printf("gpu part  %s in %zu %s; restore with: cuda-ckpt restore %s\n", human_bytes(d.gpu_bytes).c_str(),
              d.processes.size(), d.job ? "ranks of a job, cut at one point" : "process(es)", shown(image).c_str());
  for (const auto& m : d.processes) {
    std::printf("  process %d (parent %d): %s; GPU part %s%s\n", static_cast<int>(m.pid), static_cast<int>(m.parent),
                shown_command(m.command).c_str(), shown(d.gpu_image(image, m.pid).string()).c_str(),
                m.driver_checkpointed ? ", context checkpointed by the driver" : "");
    if (!m.pre_copy_image_id.empty())
      std::printf("    pre-copied while it ran into %s; the part above holds the blocks changed since\n",
                  shown(d.pre_copy_image(image, m.pid).string()).c_str());
  }
  return exit_ok;
}

int verify_process_command(const std::string& image, bool json) {
  const auto d = ckpt::read_process_image(image);
  ckpt::verify_process_image(image, d, true);
  if (json)
    std::cout << nlohmann::json{{"image", image}, {"ok", true}, {"whole_process", true}}.dump(2) << "\n";
  else
    std::printf("%s: good (a whole-process image: %zu CRIU files and %zu GPU part(s), %s, every checksum matches)\n",
                shown(image).c_str(), d.criu_files.size(), d.processes.size(), human_bytes(d.gpu_bytes).c_str());
  return exit_ok;
}

int restore_process_command(const std::string& image, bool json, bool verify_data, bool trust_owner,
                            const std::vector<std::string>& criu_args) {
  restore::process_restore_options options;
  options.image = image;
  options.verify_data = verify_data;
  options.trust_owner = trust_owner;
  options.criu_args = criu_args;
  progress_line line("restore", !json);
  const auto r = restore::restore_process(options, line.callback());
  line.finish();
  if (json) {
    std::cout << nlohmann::json{{"pid", r.pid},
                                {"processes", pids_json(r.description)},
                                {"gpu_bytes", r.description.gpu_bytes},
                                {"seconds", r.seconds},
                                {"phases", phases_json(r.phases)}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("%d\n", static_cast<int>(r.pid));
    std::fprintf(stderr, "restored process %d from %s in %.3f s (%s of GPU memory); it runs detached\n",
                 static_cast<int>(r.pid), image.c_str(), r.seconds, human_bytes(r.description.gpu_bytes).c_str());
  }
  return exit_ok;
}

}  // namespace vmmckpt::tools
