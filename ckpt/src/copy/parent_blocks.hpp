// An incremental dump's parent: its blocks, compared with the program's to leave the unchanged ones out.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "vmmckpt/image/image.hpp"

namespace vmmckpt::ckpt {

// The parent image of `dump --parent`/`suspend --parent`, checked before the program is held.
class parent_blocks {
 public:
  // Opened from disk with its own chain, every rule of the format checked. `in_process_image`: it is one
  // process's GPU part of a whole-process image (copy_settings::parent_in_process_image), whose claims it keeps.
  parent_blocks(const std::filesystem::path& parent, bool in_process_image);
  // The image a dump of a series has just committed, as the next dump's parent: its manifest as written
  // (`manifest_checksum`: commit's), on the chain of `its_parent` (null for a full image). Opening it again
  // from disk would decode every image of the chain once more, for each dump of the series.
  parent_blocks(const std::filesystem::path& image, const image::manifest& m, std::uint64_t manifest_checksum,
                const parent_blocks* its_parent);

  // The parent's extent of exactly this range and stored bytes: only its blocks can be compared
  // with a new extent's, block for block. Null when it has none.
  const image::extent* same_extent(std::uint64_t addr, std::uint64_t size, std::uint64_t stored) const;
  // How the child names it: image_id, manifest checksum, and where it was found (or `recorded_as`).
  image::parent_ref ref(const std::filesystem::path& recorded_as = {}) const;
  // This describes the image at `parent` as it is now: the same place, and every file of every image of
  // the chain still the one it was when this was made (inode, size, modification and change time), its
  // manifest's content too (the checksum a child names it by). What lets a series use it again instead of
  // opening the chain.
  bool still_describes(const std::filesystem::path& parent) const { return is_at(parent) && changed().empty(); }
  // It was made for the image at `parent` (the same directory).
  bool is_at(const std::filesystem::path& parent) const;
  // What changed in the chain's files since this was made, in words, or "": an image edited in place keeps
  // its size and may get its modification time back, not its change time or its manifest's checksum.
  std::string changed() const;
  // The chain is as long as a reader follows: a child of it would be refused.
  bool chain_full() const;

 private:
  struct file_identity {
    std::string path;
    dev_t dev;
    ino_t ino;
    off_t size;
    std::int64_t mtime_ns;
    std::int64_t ctime_ns;
    friend bool operator==(const file_identity&, const file_identity&) = default;
  };
  // Every regular file of each image directory, image after image, by name within each.
  static std::vector<file_identity> identities(const std::vector<std::filesystem::path>& dirs);
  void index_extents();

  // The reader's (sharing the reader's ownership: it lives as long as this), or a copy of what a series wrote.
  std::shared_ptr<const image::manifest> manifest_;
  std::uint64_t manifest_checksum_ = 0;
  std::filesystem::path path_;
  std::vector<std::filesystem::path> chain_dirs_;  // this image's directory, then its parents'
  std::vector<file_identity> files_;               // of every image of the chain
  std::vector<const image::extent*> by_addr_;      // every extent of every pool, sorted by address
};

// The block checksums of an extent's stored bytes, hashed on the CPU once they are on the host: where
// the GPU did not compute them (gpu_checksums), so every byte of such an extent is copied out of it.
std::vector<std::uint64_t> block_checksums(const unsigned char* stored_bytes, std::uint64_t stored);

}  // namespace vmmckpt::ckpt
