// `cuda-ckpt restore`: check an image, then start the command under the shim with the image to restore.
#include <cuda.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "exit_codes.hpp"
#include "run_command.hpp"
#include "vmmckpt/image.hpp"

namespace vmmckpt::tools {

namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Migration: the program's device `ordinal` becomes this machine's GPU
// `target` (an ordinal as this tool sees it), the two trading places in
// CUDA_VISIBLE_DEVICES so every other device keeps its ordinal too.
void remap_device(int ordinal, int target) {
  if (cuInit(0) != CUDA_SUCCESS) throw image::image_error("--device: no CUDA driver here");
  int count = 0;
  cuDeviceGetCount(&count);
  if (target < 0 || target >= count)
    throw image::image_error("--device " + std::to_string(target) + ": this machine has " + std::to_string(count) +
                             " GPU(s)");
  if (ordinal >= count)
    throw image::image_error("the image's program used device " + std::to_string(ordinal) + "; this machine has " +
                             std::to_string(count) + " GPU(s)");
  std::vector<std::string> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr && *v != '\0') visible = split(v);
  visible.resize(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i)
    if (visible[static_cast<std::size_t>(i)].empty()) visible[static_cast<std::size_t>(i)] = std::to_string(i);
  std::swap(visible[static_cast<std::size_t>(ordinal)], visible[static_cast<std::size_t>(target)]);
  std::string joined;
  for (const auto& v : visible) joined += (joined.empty() ? "" : ",") + v;
  ::setenv("CUDA_VISIBLE_DEVICES", joined.c_str(), 1);
}

}  // namespace

int restore_command(const std::string& path, bool replay, int device, bool verify_first,
                    const std::vector<std::string>& command) {
  if (command.empty()) {
    std::cerr << "cuda-ckpt restore: no command given (usage: cuda-ckpt restore IMAGE [--replay] -- COMMAND...)\n";
    return exit_usage;
  }
  // Refuse a bad image before anything starts: the program never sees it. (The restoring
  // process checks every extent again as it loads: the image may change in between.)
  const auto reader = image::reader::open(path);
  if (verify_first)
    reader.verify_data();
  else
    reader.verify_manifest();
  const image::manifest& m = reader.info();
  if (m.pools.empty()) throw image::image_error(path + ": the image holds no pool");
  // The new process places its pools exactly where the image's were.
  const image::pool& first = m.pools.front();
  const std::uint64_t base = first.base - static_cast<std::uint64_t>(first.device) * first.size;
  for (const auto& p : m.pools)
    if (p.size != first.size || p.base != base + static_cast<std::uint64_t>(p.device) * p.size)
      throw image::image_error(path + ": its pools do not follow one layout (base + device * size)");
  if (device >= 0) {
    if (m.pools.size() != 1)
      throw image::image_error(path + ": --device moves single-device images only (this one has " +
                               std::to_string(m.pools.size()) + " pools)");
    remap_device(first.device, device);
  }
  const std::string absolute = std::filesystem::absolute(path).string();
  ::setenv("VMMCKPT_RESTORE_IMAGE", absolute.c_str(), 1);
  ::setenv("VMMCKPT_RESTORE_MODE", replay ? "replay" : "live", 1);
  ::setenv("VMMCKPT_RESTORE_PID", std::to_string(::getpid()).c_str(), 1);  // exec keeps the pid
  ::setenv("VMMCKPT_POOL_BASE", std::to_string(base).c_str(), 1);
  ::setenv("VMMCKPT_POOL_SIZE", std::to_string(first.size).c_str(), 1);
  return run_under_shim(command);
}

}  // namespace vmmckpt::tools
