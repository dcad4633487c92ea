// Chains of incremental images: where a parent is looked for, and which images name one (the reader follows chains itself).
#include "vmmckpt/image/image_chain.hpp"

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>

#include "image_detail.hpp"

namespace vmmckpt::image {

std::vector<std::filesystem::path> parent_candidates(const std::filesystem::path& child_dir, const parent_ref& ref) {
  std::filesystem::path child = std::filesystem::absolute(child_dir).lexically_normal();
  if (!child.has_filename()) child = child.parent_path();
  const std::filesystem::path holder = child.parent_path();
  std::filesystem::path recorded(ref.path);
  if (!recorded.has_filename()) recorded = recorded.parent_path();
  std::vector<std::filesystem::path> out;
  out.push_back((recorded.is_absolute() ? recorded : holder / recorded).lexically_normal());
  if (!recorded.filename().empty()) {
    const auto sibling = (holder / recorded.filename()).lexically_normal();
    if (sibling != out.front() && sibling != child) out.push_back(sibling);  // never the child itself
  }
  return out;
}

std::optional<manifest> peek_manifest(const std::filesystem::path& dir) {
  std::error_code ignored;
  const auto manifest_path = dir / std::string(detail::manifest_name);
  if (!std::filesystem::is_regular_file(manifest_path, ignored)) return std::nullopt;
  if (std::filesystem::file_size(manifest_path, ignored) > detail::max_manifest_bytes) return std::nullopt;
  std::ifstream in(manifest_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return detail::decode_manifest_file(text.str()).m;
  } catch (const image_error&) {
    return std::nullopt;  // not an image of ours, or a broken one
  }
}

std::vector<std::filesystem::path> children_in(const std::filesystem::path& dir, const std::string& image_id) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code ignored;
    if (!entry.is_directory(ignored) || entry.is_symlink(ignored)) continue;
    const auto m = peek_manifest(entry.path());
    if (m && m->parent && m->parent->image_id == image_id) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace vmmckpt::image
