// `cuda-ckpt ps`: the processes running under the shim, with their state and pool figures.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/control_client.hpp"

namespace vmmckpt::tools {

int ps_command(bool as_json) {
  const auto processes = ckpt::list_processes();
  if (as_json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& p : processes) {
      // Each process's hello, as it sent it, less the reply's "ok".
      nlohmann::json entry = nlohmann::json::parse(control::encode(p.hello));
      entry.erase("ok");
      out.push_back(entry);
    }
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }
  // LIVE: the pools' live bytes and the program's own VMM mappings, which vmmckpt owns; NOT OWNED: device
  // memory no image would hold.
  std::printf("%-8s %-9s %-8s %12s %12s %12s  %s\n", "PID", "STATE", "DEVICES", "LIVE", "RESERVED", "NOT OWNED",
              "COMMAND");
  for (const auto& p : processes) {
    std::uint64_t live = 0, backed = 0;
    std::string devices;
    for (const auto& d : p.hello.devices) devices += (devices.empty() ? "" : ",") + std::to_string(d.ordinal);
    for (const auto& pool : p.hello.pools) {
      live += pool.live_bytes;
      backed += pool.backed_bytes;
    }
    std::string command;
    for (const auto& arg : p.hello.command) command += (command.empty() ? "" : " ") + arg;
    std::uint64_t not_owned = 0;
    for (const auto& m : p.hello.not_owned) not_owned += m.bytes;
    std::printf("%-8d %-9s %-8s %12s %12s %12s  %s\n", static_cast<int>(p.pid),
                std::string(control::name_of(p.hello.state)).c_str(), devices.empty() ? "-" : devices.c_str(),
                human_bytes(live).c_str(), human_bytes(backed).c_str(), human_bytes(not_owned).c_str(), command.c_str());
    if (!p.hello.not_owned.empty())
      std::printf("%-8s not owned: %s\n", "", kinds_and_sizes(p.hello.not_owned).c_str());
    if (p.hello.state == control::process_state::suspended) std::printf("%-8s image %s\n", "", p.hello.image.c_str());
  }
  return exit_ok;
}

}  // namespace vmmckpt::tools
