// An incremental dump's parent: its blocks, compared with the program's to leave the unchanged ones out.
#include "parent_blocks.hpp"

#include <algorithm>
#include <system_error>

#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/suspend_claim.hpp"

namespace vmmckpt::ckpt {

parent_blocks::parent_blocks(const std::filesystem::path& parent)
    : reader_(image::reader::open(parent)), path_(std::filesystem::absolute(parent).lexically_normal()) {
  const image::manifest& m = reader_.info();
  if (m.format < 5)
    throw image::image_error(parent.string() + ": a parent needs block checksums, and this image has none (format " +
                             std::to_string(m.format) + "): dump a full image with this tool first");
  if (m.block_size != image::write_block_size)
    throw image::image_error(parent.string() + ": its blocks are " + std::to_string(m.block_size) +
                             " bytes, this tool writes blocks of " + std::to_string(image::write_block_size));
  std::size_t chain = 0;
  for (const image::reader* r = &reader_; r != nullptr; r = r->parent()) ++chain;
  if (chain >= image::max_chain_length)
    throw image::image_error(parent.string() + ": a chain of " + std::to_string(chain) + " images already, the most a " +
                             "reader follows: merge it first (cuda-ckpt merge " + parent.string() + " -o FULL)");
  // resume and gc delete a suspend image once its program no longer needs it: a child would lose its parent.
  // The GPU part of a finished whole-process image stays with it (restore reads it, never deletes it).
  const auto dir = path_.has_filename() ? path_ : path_.parent_path();
  const bool process_part = dir.parent_path().filename() == gpu_dir_name && is_process_image(dir.parent_path().parent_path());
  for (const char* claim : {suspend_claim::pending, suspend_claim::accepted, suspend_claim::cancelled}) {
    std::error_code ec;
    if (!process_part && std::filesystem::exists(parent / claim, ec))
      throw image::image_error(parent.string() + ": a suspend image cannot be a parent (resume and gc delete it); " +
                               "use an image written by dump");
  }
  for (const auto& p : m.pools)
    for (const auto& e : p.extents) by_addr_.push_back(&e);
  std::sort(by_addr_.begin(), by_addr_.end(), [](const image::extent* a, const image::extent* b) { return a->addr < b->addr; });
}

const image::extent* parent_blocks::same_extent(std::uint64_t addr, std::uint64_t size, std::uint64_t stored) const {
  auto it = std::lower_bound(by_addr_.begin(), by_addr_.end(), addr,
                             [](const image::extent* e, std::uint64_t at) { return e->addr < at; });
  if (it == by_addr_.end() || (*it)->addr != addr || (*it)->size != size || (*it)->stored != stored) return nullptr;
  return *it;
}

image::parent_ref parent_blocks::ref(const std::filesystem::path& recorded_as) const {
  const std::filesystem::path& named = recorded_as.empty() ? path_ : recorded_as;
  std::string p = named.string();
  if (!named.has_filename()) p = named.parent_path().string();
  return {reader_.info().image_id, reader_.manifest_checksum(), p};
}

std::vector<std::uint64_t> block_checksums(const unsigned char* stored_bytes, std::uint64_t stored) {
  std::vector<std::uint64_t> out;
  out.reserve(image::block_count(stored, image::write_block_size));
  for (std::uint64_t at = 0; at < stored; at += image::write_block_size)
    out.push_back(image::block_checksum(stored_bytes + at, std::min(image::write_block_size, stored - at)));
  return out;
}

}  // namespace vmmckpt::ckpt
