// `cuda-ckpt dump --process` and `cuda-ckpt restore DIR`: the whole process, CPU side through CRIU.
#include <cstdio>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "interrupts.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"

namespace vmmckpt::tools {
namespace {

nlohmann::json phases_json(const ckpt::process_phases& phases) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [step, at] : phases) out[step] = at;
  return out;
}

nlohmann::json pids_json(const ckpt::process_image& d) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : d.processes) out.push_back(m.pid);
  return out;
}

}  // namespace

int dump_process_command(const dump_command_options& o) {
  ckpt::process_dump_options options;
  options.pid = o.pid;
  options.output = o.output;
  if (o.output.empty()) {
    char stamp[32];
    const std::time_t t = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
    options.output = "vmmckpt-process-" + std::to_string(o.pid) + "-" + stamp;
  }
  options.leave_running = o.leave_running;
  options.criu_args = o.criu_args;
  options.hold_deadline_ms = o.deadline_s * 1000;
  if (o.writers > 0) options.copy.writers = o.writers;
  options.copy.interrupt = &catch_interrupts();
  progress_line line("dump", !o.json);
  const auto r = ckpt::dump_process(options, line.callback());
  line.finish();
  const auto& d = r.description;
  if (o.json) {
    std::cout << nlohmann::json{{"image", r.image.string()},          {"pid", o.pid},
                                {"processes", pids_json(d)},          {"gpu_bytes", d.gpu_bytes},
                                {"left_running", d.left_running},     {"stopped_seconds", d.stopped_seconds},
                                {"seconds", r.seconds},               {"criu_version", d.criu_version},
                                {"phases", phases_json(r.phases)}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("dumped process %d whole (%zu under vmmckpt, %s of GPU memory; CRIU %s) to %s in %.3f s\n",
                static_cast<int>(o.pid), d.processes.size(), human_bytes(d.gpu_bytes).c_str(), d.criu_version.c_str(),
                r.image.c_str(), r.seconds);
    std::printf("  the process was stopped for %.3f s; %s\n", d.stopped_seconds,
                d.left_running ? "it goes on" : "it has ended, as with criu dump");
    std::printf("  restore it with: cuda-ckpt restore %s\n", r.image.c_str());
  }
  return exit_ok;
}

int restore_process_command(const std::string& image, bool json, bool verify_data,
                            const std::vector<std::string>& criu_args) {
  ckpt::process_restore_options options;
  options.image = image;
  options.verify_data = verify_data;
  options.criu_args = criu_args;
  progress_line line("restore", !json);
  const auto r = ckpt::restore_process(options, line.callback());
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
