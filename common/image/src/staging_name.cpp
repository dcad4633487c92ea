#include "vmmckpt/image/staging_name.hpp"

#include <unistd.h>

#include <cstdlib>

#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::image {

std::string staging_name(const std::string& final_name) {
  return final_name + std::string(staging_marker) + std::to_string(::getpid()) + "-" + random_hex16();
}

std::filesystem::path staging_path(const std::filesystem::path& final_path) {
  return final_path.parent_path() / staging_name(final_path.filename().string());
}

bool is_staging_name(std::string_view name) { return name.find(staging_marker) != std::string_view::npos; }

std::string final_name_of_staging(std::string_view name) {
  const auto at = name.rfind(staging_marker);
  return at == std::string_view::npos ? std::string() : std::string(name.substr(0, at));
}

pid_t staging_writer(std::string_view name) {
  const auto at = name.rfind(staging_marker);
  if (at == std::string_view::npos) return 0;
  const std::string after(name.substr(at + staging_marker.size()));
  return static_cast<pid_t>(std::strtol(after.c_str(), nullptr, 10));
}

}  // namespace vmmckpt::image
