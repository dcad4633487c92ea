// An incremental dump's parent: its blocks, compared with the program's to leave the unchanged ones out.
#include "copy/parent_blocks.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::ckpt {
namespace {

std::filesystem::path absolute_dir(const std::filesystem::path& p) {
  std::filesystem::path a = std::filesystem::absolute(p).lexically_normal();
  return a.has_filename() ? a : a.parent_path();
}

}  // namespace

parent_blocks::parent_blocks(const std::filesystem::path& parent, bool in_process_image)
    : path_(absolute_dir(parent)), chain_dirs_{path_} {
  // The parent's files are taken before it is read: a change made meanwhile shows at the next
  // still_describes(). (Its parents' are taken once they are read.)
  files_ = identities(chain_dirs_);
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
  for (const image::reader* r = reader->parent(); r != nullptr; r = r->parent())
    chain_dirs_.push_back(absolute_dir(r->dir()));
  if (chain_dirs_.size() >= image::max_chain_length)
    throw image::image_error(parent.string() + ": a chain of " + std::to_string(chain_dirs_.size()) +
                             " images already, the most a reader follows: merge it first (cuda-ckpt merge " +
                             parent.string() + " -o FULL)");
  const auto parents = identities({chain_dirs_.begin() + 1, chain_dirs_.end()});
  files_.insert(files_.end(), parents.begin(), parents.end());
  // resume and gc delete a suspend image once its program no longer needs it: a child would lose its parent.
  // The GPU part of a finished whole-process image stays with it (restore reads it, never deletes it).
  for (const char* claim : {suspend_claim::pending, suspend_claim::accepted, suspend_claim::cancelled}) {
    std::error_code ec;
    if (!in_process_image && std::filesystem::exists(parent / claim, ec))
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
      chain_dirs_{path_},
      files_(identities(chain_dirs_)) {
  if (its_parent != nullptr) {
    chain_dirs_.insert(chain_dirs_.end(), its_parent->chain_dirs_.begin(), its_parent->chain_dirs_.end());
    files_.insert(files_.end(), its_parent->files_.begin(), its_parent->files_.end());
  }
  index_extents();
}

void parent_blocks::index_extents() {
  for (const auto& p : manifest_->pools)
    for (const auto& e : p.extents) by_addr_.push_back(&e);
  std::sort(by_addr_.begin(), by_addr_.end(),
            [](const image::extent* a, const image::extent* b) { return a->addr < b->addr; });
}

std::vector<parent_blocks::file_identity> parent_blocks::identities(const std::vector<std::filesystem::path>& dirs) {
  std::vector<file_identity> out;
  for (const auto& dir : dirs) {
    const std::size_t first = out.size();
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      struct stat st;
      const std::string p = entry.path().string();
      if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode))
        out.push_back({p, st.st_dev, st.st_ino, st.st_size,
                       static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                       static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec});
    }
    std::sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
              [](const file_identity& a, const file_identity& b) { return a.path < b.path; });
  }
  return out;
}

bool parent_blocks::is_at(const std::filesystem::path& parent) const { return absolute_dir(parent) == path_; }

bool parent_blocks::chain_full() const { return chain_dirs_.size() >= image::max_chain_length; }

std::string parent_blocks::changed() const {
  if (identities(chain_dirs_) != files_)
    return "a file of " + path_.string() +
           " or of its parents changed since it was written (inode, size, or "
           "modification or change time)";
  // The manifest's content: the checksum a child records for its parent (XXH3-64 of manifest.json, as the
  // reader takes it), read again, never through a link.
  const std::string manifest = (path_ / "manifest.json").string();
  const int fd = ::open(manifest.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  std::string text;
  if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < (64 << 20)) {
    text.resize(static_cast<std::size_t>(st.st_size));
    if (::pread(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) text.clear();
  }
  if (fd >= 0) ::close(fd);
  if (text.empty() || image::block_checksum(text.data(), text.size()) != manifest_checksum_)
    return manifest + " is not the one written (its checksum differs)";
  return {};
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
