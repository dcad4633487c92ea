// An incremental dump's parent: its blocks, compared with the program's to leave the unchanged ones out.
#include "parent_blocks.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <system_error>

#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/suspend_claim.hpp"

namespace vmmckpt::ckpt {
namespace {

std::filesystem::path absolute_dir(const std::filesystem::path& p) {
  std::filesystem::path a = std::filesystem::absolute(p).lexically_normal();
  return a.has_filename() ? a : a.parent_path();
}

}  // namespace

parent_blocks::parent_blocks(const std::filesystem::path& parent) : path_(absolute_dir(parent)) {
  // The parent's files are taken before it is read: a change made meanwhile shows at the next
  // still_describes(). (Its parents' are taken once they are read.)
  files_ = identities(path_);
  auto reader = std::make_shared<const image::reader>(image::reader::open(parent));
  manifest_ = std::shared_ptr<const image::manifest>(reader, &reader->info());
  manifest_checksum_ = reader->manifest_checksum();
  const image::manifest& m = *manifest_;
  if (m.format < 5)
    throw image::image_error(parent.string() + ": a parent needs block checksums, and this image has none (format " +
                             std::to_string(m.format) + "): dump a full image with this tool first");
  if (m.block_size != image::write_block_size)
    throw image::image_error(parent.string() + ": its blocks are " + std::to_string(m.block_size) +
                             " bytes, this tool writes blocks of " + std::to_string(image::write_block_size));
  chain_length_ = 0;
  for (const image::reader* r = reader.get(); r != nullptr; r = r->parent()) {
    ++chain_length_;
    if (r != reader.get()) {
      auto more = identities(absolute_dir(r->dir()));
      files_.insert(files_.end(), more.begin(), more.end());
    }
  }
  check_chain_length();
  // resume and gc delete a suspend image once its program no longer needs it: a child would lose its parent.
  // The GPU part of a finished whole-process image stays with it (restore reads it, never deletes it).
  const bool process_part =
      path_.parent_path().filename() == gpu_dir_name && is_process_image(path_.parent_path().parent_path());
  for (const char* claim : {suspend_claim::pending, suspend_claim::accepted, suspend_claim::cancelled}) {
    std::error_code ec;
    if (!process_part && std::filesystem::exists(parent / claim, ec))
      throw image::image_error(parent.string() + ": a suspend image cannot be a parent (resume and gc delete it); " +
                               "use an image written by dump");
  }
  index_extents();
}

parent_blocks::parent_blocks(const std::filesystem::path& image, const image::manifest& m,
                             std::uint64_t manifest_checksum, const parent_blocks* its_parent)
    : manifest_(std::make_shared<const image::manifest>(m)),
      manifest_checksum_(manifest_checksum),
      path_(absolute_dir(image)),
      chain_length_(its_parent != nullptr ? its_parent->chain_length_ + 1 : 1),
      files_(identities(path_)) {
  if (its_parent != nullptr) files_.insert(files_.end(), its_parent->files_.begin(), its_parent->files_.end());
  index_extents();
}

void parent_blocks::check_chain_length() const {
  if (chain_length_ >= image::max_chain_length)
    throw image::image_error(path_.string() + ": a chain of " + std::to_string(chain_length_) +
                             " images already, the most a reader follows: merge it first (cuda-ckpt merge " +
                             path_.string() + " -o FULL)");
}

void parent_blocks::index_extents() {
  for (const auto& p : manifest_->pools)
    for (const auto& e : p.extents) by_addr_.push_back(&e);
  std::sort(by_addr_.begin(), by_addr_.end(), [](const image::extent* a, const image::extent* b) { return a->addr < b->addr; });
}

std::vector<parent_blocks::file_identity> parent_blocks::identities(const std::filesystem::path& image) {
  std::vector<file_identity> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(image, ec)) {
    struct stat st;
    const std::string p = entry.path().string();
    if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      out.push_back({p, st.st_dev, st.st_ino, st.st_size,
                     static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec});
  }
  std::sort(out.begin(), out.end(), [](const file_identity& a, const file_identity& b) { return a.path < b.path; });
  return out;
}

bool parent_blocks::still_describes(const std::filesystem::path& parent) const {
  if (absolute_dir(parent) != path_) return false;
  if (chain_length_ >= image::max_chain_length) return false;  // opened again, it is refused, saying why
  std::vector<file_identity> now;
  std::filesystem::path dir;
  for (const file_identity& f : files_) {
    const std::filesystem::path d = std::filesystem::path(f.path).parent_path();
    if (d == dir) continue;
    dir = d;
    auto more = identities(dir);
    now.insert(now.end(), more.begin(), more.end());
  }
  return now == files_;
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
  return {manifest_->image_id, manifest_checksum_, p};
}

std::vector<std::uint64_t> block_checksums(const unsigned char* stored_bytes, std::uint64_t stored) {
  std::vector<std::uint64_t> out;
  out.reserve(image::block_count(stored, image::write_block_size));
  for (std::uint64_t at = 0; at < stored; at += image::write_block_size)
    out.push_back(image::block_checksum(stored_bytes + at, std::min(image::write_block_size, stored - at)));
  return out;
}

}  // namespace vmmckpt::ckpt
