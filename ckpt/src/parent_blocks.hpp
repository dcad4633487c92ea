// An incremental dump's parent: its blocks, compared with the program's to leave the unchanged ones out.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "vmmckpt/image.hpp"

namespace vmmckpt::ckpt {

// The parent image of `dump --parent`/`suspend --parent`, opened (with its own chain) and checked
// before the program is held.
class parent_blocks {
 public:
  explicit parent_blocks(const std::filesystem::path& parent);
  // The parent's extent of exactly this range and stored bytes: only its blocks can be compared
  // with a new extent's, block for block. Null when it has none.
  const image::extent* same_extent(std::uint64_t addr, std::uint64_t size, std::uint64_t stored) const;
  // How the child names it: image_id, manifest checksum, and where it was found (or `recorded_as`).
  image::parent_ref ref(const std::filesystem::path& recorded_as = {}) const;

 private:
  image::reader reader_;
  std::filesystem::path path_;
  std::vector<const image::extent*> by_addr_;  // every extent of every pool, sorted by address
};

// The block checksums of an extent's stored bytes, hashed on the CPU once they are on the host: where
// the GPU did not compute them (gpu_checksums), so every byte of such an extent is copied out of it.
std::vector<std::uint64_t> block_checksums(const unsigned char* stored_bytes, std::uint64_t stored);

}  // namespace vmmckpt::ckpt
