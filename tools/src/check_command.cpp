// `cuda-ckpt check`: ask a process whether its pool's placement and physical memory agree.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "vmmckpt/ckpt/control_client.hpp"

namespace vmmckpt::tools {

int check_command(pid_t pid, bool as_json) {
  ckpt::control_client client(pid);
  const auto r = client.check();
  if (as_json) {
    std::cout << nlohmann::json{{"consistent", r.consistent}, {"problems", r.problems}, {"pid", pid}}.dump(2) << "\n";
  } else if (r.consistent) {
    std::printf("process %d: pool consistent\n", static_cast<int>(pid));
  } else {
    for (const auto& p : r.problems) std::fprintf(stderr, "process %d: %s\n", static_cast<int>(pid), p.c_str());
  }
  return r.consistent ? exit_ok : exit_failure;
}

subcommand add_check(CLI::App& app) {
  struct options {
    pid_t pid = 0;
    bool json = false;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand("check", "Check a process's pool: placement and physical memory agree");
  add_pid(command, o->pid, "The process (running under vmmckpt)");
  command->add_flag("--json", o->json, "Print JSON");

  return {command, [o] { return check_command(o->pid, o->json); }};
}

}  // namespace vmmckpt::tools
