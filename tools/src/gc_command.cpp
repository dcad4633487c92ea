// `cuda-ckpt gc`: remove what crashed or killed tools left behind, when no process depends on it.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "vmmckpt/ckpt/leftovers.hpp"

namespace vmmckpt::tools {

int gc_command(const std::vector<std::string>& dirs, bool dry_run, bool as_json) {
  std::vector<std::filesystem::path> paths(dirs.begin(), dirs.end());
  const auto report = ckpt::collect_leftovers(paths, dry_run);
  if (as_json) {
    nlohmann::json out = {{"removed", nlohmann::json::array()},
                          {"kept", nlohmann::json::array()},
                          {"skipped", nlohmann::json::array()},
                          {"dry_run", dry_run}};
    for (const auto& l : report.removed) out["removed"].push_back({{"path", l.path.string()}, {"why", l.why}});
    for (const auto& l : report.kept) out["kept"].push_back({{"path", l.path.string()}, {"why", l.why}});
    for (const auto& l : report.skipped) out["skipped"].push_back({{"path", l.path.string()}, {"why", l.why}});
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  for (const auto& l : report.removed)
    std::printf("%s %s: %s\n", dry_run ? "would remove" : "removed", l.path.c_str(), l.why.c_str());
  for (const auto& l : report.kept) std::printf("kept %s: %s\n", l.path.c_str(), l.why.c_str());
  for (const auto& l : report.skipped) std::printf("skipped %s: %s\n", l.path.c_str(), l.why.c_str());
  if (!report.skipped.empty())
    std::fprintf(stderr,
                 "cuda-ckpt gc: warning: %zu entr%s skipped (this user cannot read them); the rest was collected\n",
                 report.skipped.size(), report.skipped.size() == 1 ? "y" : "ies");
  if (report.removed.empty() && report.kept.empty() && report.skipped.empty()) std::printf("nothing left behind\n");
  return exit_ok;
}

subcommand add_gc(CLI::App& app) {
  struct options {
    std::vector<std::string> dirs;
    bool dry_run = false, json = false;
  };
  auto o = std::make_shared<options>();
  auto* command = app.add_subcommand("gc", "Remove what killed tools left behind, when no process depends on it");
  command
      ->add_option("dirs", o->dirs,
                   "Directories to scan (default: the default suspend directory, /dev/shm/vmmckpt-UID)")
      ->type_name("DIR");
  command->add_flag("--dry-run", o->dry_run, "Say what would be removed, remove nothing");
  command->add_flag("--json", o->json, "Print the result as JSON");
  command->footer(
      "Removes unfinished images (NAME.partial-PID-...) whose writer is gone; suspend images nobody depends on\n"
      "(withdrawn, or whose tool died before the program took them, or whose program is gone or resumed);\n"
      "and control socket files nobody listens at any more (their process is gone; only sockets, never another\n"
      "file). A suspend image of a process that does not answer (stopped, busy) stays. `cuda-ckpt ps` lists\n"
      "the images of processes that died as orphaned, with their size and the gc command that removes them.\n"
      "What this user cannot read (another user's image in a shared tree) is skipped, named and counted, and\n"
      "the scan goes on: gc still exits 0, with a warning on stderr (`skipped` in --json).");

  return {command, [o] { return gc_command(o->dirs, o->dry_run, o->json); }};
}

}  // namespace vmmckpt::tools
