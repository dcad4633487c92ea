// `cuda-ckpt check`: ask a process whether its pool's placement and physical memory agree.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "vmmckpt/ckpt/control_client.hpp"

namespace vmmckpt::tools {

int check_command(pid_t pid, bool as_json) {
  ckpt::control_client client(pid);
  const auto r = client.call({{"op", "check"}});
  const bool consistent = r.value("consistent", false);
  if (as_json) {
    nlohmann::json out = r;
    out.erase("ok");
    out["pid"] = pid;
    std::cout << out.dump(2) << "\n";
  } else if (consistent) {
    std::printf("process %d: pool consistent\n", static_cast<int>(pid));
  } else {
    for (const auto& p : r.value("problems", std::vector<std::string>{}))
      std::fprintf(stderr, "process %d: %s\n", static_cast<int>(pid), p.c_str());
  }
  return consistent ? exit_ok : exit_failure;
}

}  // namespace vmmckpt::tools
