// `cuda-ckpt restore`: check an image, then start the command under the shim with the image to restore.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "run_command.hpp"
#include "vmmckpt/image.hpp"

namespace vmmckpt::tools {

int restore_command(const std::string& path, bool replay, const std::vector<std::string>& command) {
  if (command.empty()) {
    std::cerr << "cuda-ckpt restore: no command given (usage: cuda-ckpt restore IMAGE [--replay] -- COMMAND...)\n";
    return exit_usage;
  }
  // Refuse a bad image before anything starts: the program never sees it.
  const auto reader = image::reader::open(path);
  reader.verify_data();
  const image::manifest& m = reader.info();
  if (m.pools.empty()) throw image::image_error(path + ": the image holds no pool");
  // The new process places its pools exactly where the image's were.
  const image::pool& first = m.pools.front();
  const std::uint64_t base = first.base - static_cast<std::uint64_t>(first.device) * first.size;
  for (const auto& p : m.pools)
    if (p.size != first.size || p.base != base + static_cast<std::uint64_t>(p.device) * p.size)
      throw image::image_error(path + ": its pools do not follow one layout (base + device * size)");
  const std::string absolute = std::filesystem::absolute(path).string();
  ::setenv("VMMCKPT_RESTORE_IMAGE", absolute.c_str(), 1);
  ::setenv("VMMCKPT_RESTORE_MODE", replay ? "replay" : "live", 1);
  ::setenv("VMMCKPT_RESTORE_PID", std::to_string(::getpid()).c_str(), 1);  // exec keeps the pid
  ::setenv("VMMCKPT_POOL_BASE", std::to_string(base).c_str(), 1);
  ::setenv("VMMCKPT_POOL_SIZE", std::to_string(first.size).c_str(), 1);
  return run_under_shim(command);
}

}  // namespace vmmckpt::tools
