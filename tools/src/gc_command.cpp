// `cuda-ckpt gc`: remove what crashed or killed tools left behind, when no process depends on it.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "vmmckpt/ckpt/leftovers.hpp"

namespace vmmckpt::tools {

int gc_command(const std::vector<std::string>& dirs, bool dry_run, bool as_json) {
  std::vector<std::filesystem::path> paths(dirs.begin(), dirs.end());
  const auto report = ckpt::collect_leftovers(paths, dry_run);
  if (as_json) {
    nlohmann::json out = {{"removed", nlohmann::json::array()}, {"kept", nlohmann::json::array()}, {"dry_run", dry_run}};
    for (const auto& l : report.removed) out["removed"].push_back({{"path", l.path.string()}, {"why", l.why}});
    for (const auto& l : report.kept) out["kept"].push_back({{"path", l.path.string()}, {"why", l.why}});
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  for (const auto& l : report.removed)
    std::printf("%s %s: %s\n", dry_run ? "would remove" : "removed", l.path.c_str(), l.why.c_str());
  for (const auto& l : report.kept) std::printf("kept %s: %s\n", l.path.c_str(), l.why.c_str());
  if (report.removed.empty() && report.kept.empty()) std::printf("nothing left behind\n");
  return exit_ok;
}

}  // namespace vmmckpt::tools
