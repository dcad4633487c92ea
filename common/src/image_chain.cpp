// Chains of incremental images: where a parent is looked for, which images name one, and merging a chain into a full image.
#include "vmmckpt/image_chain.hpp"

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
    if (sibling != out.front()) out.push_back(sibling);
  }
  return out;
}

std::vector<std::filesystem::path> children_in(const std::filesystem::path& dir, const std::string& image_id) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code ignored;
    if (!entry.is_directory(ignored) || entry.is_symlink(ignored)) continue;
    const auto manifest_path = entry.path() / std::string(detail::manifest_name);
    if (!std::filesystem::is_regular_file(manifest_path, ignored)) continue;
    if (std::filesystem::file_size(manifest_path, ignored) > detail::max_manifest_bytes) continue;
    std::ifstream in(manifest_path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    try {
      const auto decoded = detail::decode_manifest_file(text.str());
      if (decoded.m.parent && decoded.m.parent->image_id == image_id) out.push_back(entry.path());
    } catch (const image_error&) {
      // Not an image of ours, or a broken one: it names no parent we could honour.
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

manifest merge(const reader& chain, const std::filesystem::path& output, std::uint32_t files,
               const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  manifest m = chain.info();
  m.parent.reset();
  m.block_size = write_block_size;
  files = std::clamp<std::uint32_t>(files, 1, max_data_files);
  m.data_files = files;
  std::uint64_t total = 0, done = 0;
  for (const pool& p : m.pools)
    for (const extent& e : p.extents) total += e.stored;
  writer w(output, files);
  constexpr std::uint64_t piece = 8u << 20;
  auto buffer = std::make_unique_for_overwrite<unsigned char[]>(piece);
  std::uint32_t next_file = 0;
  for (std::size_t p = 0; p < m.pools.size(); ++p)
    for (std::size_t k = 0; k < m.pools[p].extents.size(); ++k) {
      const extent& from = chain.info().pools[p].extents[k];
      const std::uint32_t f = next_file;
      next_file = (next_file + 1) % files;
      // Every byte is checked against the chain's checksums (format 5: the blocks', combined) on the
      // way; the writer hashes it again for the new image.
      streaming_checksum sum(chain.info().format >= 5 ? chain.info().block_size : 0);
      w.begin_extent(f, from.addr, from.size, from.stored);
      for (std::uint64_t at = 0; at < from.stored;) {
        const std::uint64_t n = std::min(piece, from.stored - at);
        chain.read_part(from, at, n, buffer.get());
        sum.update(buffer.get(), n);
        w.write(f, buffer.get(), n);
        at += n;
        if (progress) progress(done += n, total);
      }
      chain.check_extent(from, sum.value());
      const extent e = w.end_extent(f);
      m.pools[p].extents[k] = e;
    }
  m.format = format_version;
  m.data_bytes = total;
  w.commit(m);
  m.image_id = w.image_id();
  return m;
}

}  // namespace vmmckpt::image
