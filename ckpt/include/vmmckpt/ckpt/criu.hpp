// CRIU, the CPU side of a whole-process checkpoint: found, its version checked, and run.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "vmmckpt/ckpt/control_client.hpp"

namespace vmmckpt::ckpt {

// CRIU cannot be used here: what() says why and what to install.
struct criu_unavailable : tool_error {
  using tool_error::tool_error;
};

inline constexpr int criu_min_major = 4;  // 3.x fails `criu check` on 6.x kernels (its vDSO check)

struct criu_tool {
  std::string path;     // what is run: $VMMCKPT_CRIU, else criu found on PATH
  std::string version;  // as `criu --version` says it, e.g. "4.1.1"
};

// Finds CRIU 4.0 or later; throws criu_unavailable naming what was found and how to provide it.
criu_tool find_criu();

// Runs `criu ARGS... --log-file LOG -v2` and waits; its stdout and stderr go to LOG too. Returns
// CRIU's exit status (or 128 + signal).
int run_criu(const criu_tool& criu, const std::vector<std::string>& args, const std::filesystem::path& log);

// The lines of a CRIU log worth showing when it failed: its errors, else its last lines.
std::string criu_log_excerpt(const std::filesystem::path& log);

}  // namespace vmmckpt::ckpt
