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
  // How the child names it: image_id, manifest checksum, and where it was found.
  image::parent_ref ref() const;

 private:
  image::reader reader_;
  std::filesystem::path path_;
  std::vector<const image::extent*> by_addr_;  // every extent of every pool, sorted by address
};

// The block checksums of an extent's stored bytes, the one place an incremental dump takes them
// from: today the CPU hashes the bytes once they are on the host (so every byte is still copied out
// of the GPU); a GPU kernel computing image::block_checksum on the device would supply them before
// the copy, so that unchanged blocks are not copied at all.
std::vector<std::uint64_t> block_checksums(const unsigned char* stored_bytes, std::uint64_t stored);

}  // namespace vmmckpt::ckpt
