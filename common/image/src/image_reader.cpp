// Opens an image, checks it completely before handing it out, and reads extents with checksum checks.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "image_detail.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/image_chain.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::image {
namespace {

using detail::errno_text;
using detail::fail;

// Extents are read in pieces; from this size on, each piece is hashed on a helper thread while
// the next is read (below it, starting the thread costs more than it saves).
constexpr std::size_t read_piece = 8u << 20;
constexpr std::uint64_t background_hash_from = 2 * read_piece;

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

// Fills [dst, dst + size) from `offset`; an early end of file is a defect of the image.
void pread_all(int fd, void* dst, std::size_t size, std::uint64_t offset, const std::string& path) {
  auto p = static_cast<char*>(dst);
  while (size > 0) {
    const ssize_t r = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path + ": read failed at offset " + std::to_string(offset) + ": " + errno_text(errno));
    }
    if (r == 0) fail(path + ": unexpected end of file at offset " + std::to_string(offset));
    p += r;
    size -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

}  // namespace

struct reader::impl {
  std::filesystem::path dir;
  manifest info;
  std::vector<int> data_fds;  // one per data file
  std::vector<std::string> data_paths;
  std::uint64_t manifest_checksum = 0;                     // of manifest.json as read
  std::vector<std::uint64_t> recorded_manifest_checksums;  // as each data file's header records it
  struct located {
    std::uint32_t file;
    std::uint64_t offset;
    std::uint64_t addr;  // format 5: extents wholly in the parent share their file offset with the next
    std::size_t pool, index;
    bool operator<(const located& o) const {
      return file != o.file ? file < o.file : offset != o.offset ? offset < o.offset : addr < o.addr;
    }
  };
  std::vector<located> by_place;  // every extent, sorted by (file, offset, addr)
  // Format 5, an image with a parent: the parent, opened with its own parents, and for each extent
  // with blocks in the parent the parent's extent of the same address, size and stored bytes.
  std::unique_ptr<reader> parent;
  std::vector<std::vector<const extent*>> parent_extent;  // [pool][extent], null where none is needed

  ~impl() {
    for (int fd : data_fds)
      if (fd >= 0) ::close(fd);
  }

  void open_data_files(int dir_fd);
  void open_data_file(int dir_fd, std::uint32_t k, std::uint64_t payload);
  void index_by_place();

  const located& locate(const extent& e) const {
    const located key{e.file, e.offset, e.addr, 0, 0};
    auto it = std::lower_bound(by_place.begin(), by_place.end(), key);
    if (it != by_place.end() && it->file == e.file && it->offset == e.offset && it->addr == e.addr) {
      const extent& mine = info.pools[it->pool].extents[it->index];
      if (mine.addr == e.addr && mine.size == e.size && mine.stored == e.stored && mine.checksum == e.checksum)
        return *it;
    }
    fail(dir.string() + ": the extent at " + hex(e.addr) + " (data file " + std::to_string(e.file) + ", offset " +
         std::to_string(e.offset) + ") is not an extent of this image");
  }

  void check(const located& l, std::uint64_t got) const {
    const extent& e = info.pools[l.pool].extents[l.index];
    if (got != e.checksum)
      fail(data_paths[e.file] + ": " + detail::extent_name(l.pool, l.index) + " at " + hex(e.addr) +
           ": checksum mismatch (manifest " + hex16(e.checksum) + ", data " + hex16(got) + ")");
  }

  // Where a block's bytes are: this image's data file, the parent, or nowhere (format 6: a zero block).
  enum class place { here, parent, zero };
  static place place_of(const block& b) { return b.zero ? place::zero : b.in_parent ? place::parent : place::here; }

  // `size` stored bytes of an extent from `offset`, unchecked: from this image's data file, for format 5
  // blocks in the parent from the parent (which may take them from its own), format 6 zero blocks as zeros.
  void read_stored(const located& l, std::uint64_t offset, std::uint64_t size, unsigned char* dst) const {
    const extent& e = info.pools[l.pool].extents[l.index];
    const extent* from_parent = parent_extent.empty() ? nullptr : parent_extent[l.pool][l.index];
    const bool all_here = std::none_of(e.blocks.begin(), e.blocks.end(), [](const block& b) { return b.zero; });
    if (from_parent == nullptr && all_here) {  // every block is here, back to back
      pread_all(data_fds[e.file], dst, size, detail::data_header_size + e.offset + offset, data_paths[e.file]);
      return;
    }
    const std::uint64_t bs = info.block_size;
    std::uint64_t b = offset / bs;
    std::uint64_t here_before = 0;  // bytes of blocks before b in this image's file (all whole blocks)
    for (std::uint64_t k = 0; k < b; ++k)
      if (place_of(e.blocks[k]) == place::here) here_before += bs;
    while (size > 0) {
      // A run of blocks from the same place: one read.
      const place from = place_of(e.blocks[b]);
      std::uint64_t run_end = b + 1;
      while (run_end < e.blocks.size() && place_of(e.blocks[run_end]) == from) ++run_end;
      const std::uint64_t n = std::min(size, std::min(run_end * bs, e.stored) - offset);
      if (from == place::parent)
        parent->read_part(*from_parent, offset, n, dst);
      else if (from == place::zero)
        std::memset(dst, 0, n);
      else
        pread_all(data_fds[e.file], dst, n, detail::data_header_size + e.offset + here_before + (offset - b * bs),
                  data_paths[e.file]);
      if (from == place::here) here_before += std::min(run_end * bs, e.stored) - b * bs;
      dst += n;
      offset += n;
      size -= n;
      b = run_end;
    }
  }

  // Format 5: reads an extent piece by piece, wherever its blocks are, and checks every block's
  // checksum (their combination is the extent's: validate() checked it). With `advance` the pieces
  // fill dst one after another; without, they alternate between the two piece-sized halves of dst.
  void read_blocks_checked(const located& l, unsigned char* dst, bool advance) const {
    const extent& e = info.pools[l.pool].extents[l.index];
    const std::uint64_t bs = info.block_size;
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    std::uint64_t in_block = 0;
    std::size_t b = 0;
    std::uint64_t at = 0;
    for (std::size_t k = 0; at < e.stored; ++k) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(read_piece, e.stored - at));
      unsigned char* p = advance ? dst + at : dst + (k % 2) * read_piece;
      read_stored(l, at, n, p);
      for (std::size_t done = 0; done < n;) {
        const std::uint64_t this_block = std::min(bs, e.stored - b * bs);
        const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(n - done, this_block - in_block));
        detail::checksum_update(&state, p + done, m);
        done += m;
        in_block += m;
        if (in_block == this_block) {
          const std::uint64_t got = XXH3_64bits_digest(&state);
          if (got != e.blocks[b].checksum)
            fail(block_holder(l, b) + ": " + detail::extent_name(l.pool, l.index) + " at " + hex(e.addr) +
                 ": checksum mismatch in blocks[" + std::to_string(b) + "] (stored bytes from " +
                 std::to_string(b * bs) + "; manifest " + hex16(e.blocks[b].checksum) + ", data " + hex16(got) + ")");
          XXH3_64bits_reset(&state);
          in_block = 0;
          ++b;
        }
      }
      at += n;
    }
  }

  // The data file that holds block b of the extent at l: this image's own, or that of the ancestor the block
  // was left to (a parent's block may be its parent's), named with how far up the chain it is: a damaged
  // block is reported where it is damaged.
  std::string block_holder(const located& l, std::size_t b) const {
    const impl* at = this;
    located here = l;
    int up = 0;
    for (;;) {
      const extent& e = at->info.pools[here.pool].extents[here.index];
      if (!e.blocks[b].in_parent || at->parent == nullptr || at->parent_extent.empty()) {
        if (up == 0) return at->data_paths[e.file];
        return at->data_paths[e.file] +
               (up == 1 ? " (the parent of " + dir.string() + ")"
                        : " (an ancestor of " + dir.string() + ", " + std::to_string(up) + " images up its chain)");
      }
      const extent* in_parent = at->parent_extent[here.pool][here.index];
      at = at->parent->impl_.get();
      here = at->locate(*in_parent);
      ++up;
    }
  }

  // Opens the parent this image names, where it can be found, with its own parents, and checks that
  // it is the very image this one was written against and holds every block taken from it.
  void open_parent(std::vector<std::string>& children) {
    const parent_ref& ref = *info.parent;
    const std::string me = dir.string();
    const std::string wanted = "its parent " + ref.path + " (image " + ref.image_id + ")";
    children.push_back(me + " (image " + info.image_id + ")");
    if (children.size() >= max_chain_length)
      fail(me + ": the chain of parents is longer than " + std::to_string(max_chain_length) +
           " images: " + "merge it (cuda-ckpt merge) into a full image");
    for (std::size_t k = 0; k + 1 < children.size(); ++k)
      if (children[k].find("(image " + ref.image_id + ")") != std::string::npos)
        fail(me + ": " + wanted + " is also its own descendant " + children[k] + ": a cycle of parents");
    std::string looked;
    const auto candidates = parent_candidates(dir, ref);
    for (const auto& candidate : candidates) {
      std::error_code ec;
      if (!std::filesystem::exists(candidate / std::string(detail::manifest_name), ec)) {
        looked += (looked.empty() ? "" : ", ") + candidate.string();
        continue;
      }
      // The fallback beside the child is taken only if it is the parent: another image of that name there
      // (a pre-copied part's own child, say) is not opened. One that cannot be read is, and says why.
      if (candidate != candidates.front()) {
        if (const auto m = peek_manifest(candidate); m && m->image_id != ref.image_id) {
          looked += (looked.empty() ? "" : ", ") + candidate.string() + " (image " + m->image_id + ", another)";
          continue;
        }
      }
      std::unique_ptr<reader> found;
      try {
        found = std::make_unique<reader>(open_link(candidate, children));
      } catch (const image_error& e) {
        fail(me + ": " + wanted + " is broken, found at " + candidate.string() + ": " + e.what());
      }
      const manifest& pm = found->info();
      if (pm.image_id != ref.image_id)
        fail(me + ": " + wanted + " has changed: " + candidate.string() + " is image " + pm.image_id +
             " (another image under that name)");
      if (found->manifest_checksum() != ref.manifest_checksum)
        fail(me + ": " + wanted + " has changed: " + candidate.string() + "/manifest.json hashes to " +
             hex16(found->manifest_checksum()) + ", the child recorded " + hex16(ref.manifest_checksum));
      if (pm.format < 5 || pm.block_size != info.block_size)
        fail(me + ": " + wanted + " at " + candidate.string() + " has " +
             (pm.format < 5 ? "no block checksums (format " + std::to_string(pm.format) + ")"
                            : "blocks of " + std::to_string(pm.block_size) + " bytes, the child " +
                                  std::to_string(info.block_size)));
      parent = std::move(found);
      link_parent_extents(candidate.string());
      children.pop_back();
      return;
    }
    fail(me + ": " + wanted + " is missing: it is not at " + looked +
         " (put it back there, or next to this image; `cuda-ckpt merge` makes a chain into a full image)");
  }

  // Every extent with blocks in the parent has the parent's extent of the same address, size and
  // stored bytes, whose blocks there are the same.
  void link_parent_extents(const std::string& where) {
    const manifest& pm = parent->info();
    parent_extent.resize(info.pools.size());
    for (std::size_t p = 0; p < info.pools.size(); ++p) {
      parent_extent[p].assign(info.pools[p].extents.size(), nullptr);
      for (std::size_t k = 0; k < info.pools[p].extents.size(); ++k) {
        const extent& e = info.pools[p].extents[k];
        if (std::none_of(e.blocks.begin(), e.blocks.end(), [](const block& b) { return b.in_parent; })) continue;
        const extent* match = nullptr;
        for (const pool& pp : pm.pools) {
          auto it = std::lower_bound(pp.extents.begin(), pp.extents.end(), e.addr,
                                     [](const extent& x, std::uint64_t at) { return x.addr < at; });
          if (it != pp.extents.end() && it->addr == e.addr) match = &*it;
        }
        if (match == nullptr || match->size != e.size || match->stored != e.stored)
          fail(dir.string() + ": " + detail::extent_name(p, k) + " at " + hex(e.addr) +
               " takes blocks from its parent " + where + ", which has no extent of the same range and size");
        for (std::size_t b = 0; b < e.blocks.size(); ++b)
          if (e.blocks[b].in_parent && match->blocks[b].checksum != e.blocks[b].checksum)
            fail(dir.string() + ": " + detail::extent_name(p, k) + ".blocks[" + std::to_string(b) + "] at " +
                 hex(e.addr) + " is in its parent " + where + ", whose block there has another checksum");
        parent_extent[p][k] = match;
      }
    }
  }

  // Reads an extent piece by piece and checks its checksum. With `advance` the pieces fill
  // dst one after another; without, they alternate between the two piece-sized halves of dst.
  void read_checked(const located& l, unsigned char* dst, bool advance, detail::background_hasher* hasher) const {
    const extent& e = info.pools[l.pool].extents[l.index];
    if (info.format >= 5) return read_blocks_checked(l, dst, advance);
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    std::unique_ptr<detail::background_hasher> own;
    if (e.stored < background_hash_from) {
      hasher = nullptr;
    } else if (hasher == nullptr) {
      own = std::make_unique<detail::background_hasher>();
      hasher = own.get();
    }
    {
      std::optional<detail::hash_waiter> done;
      if (hasher != nullptr) done.emplace(*hasher);
      std::uint64_t at = 0;
      for (std::size_t k = 0; at < e.stored; ++k) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(read_piece, e.stored - at));
        unsigned char* p = advance ? dst + at : dst + (k % 2) * read_piece;
        // When pieces alternate, start() below has already waited for the hash of the piece
        // that last used this half.
        pread_all(data_fds[e.file], p, n, detail::data_header_size + e.offset + at, data_paths[e.file]);
        if (hasher != nullptr)
          hasher->start(&state, p, n);
        else
          detail::checksum_update(&state, p, n);
        at += n;
      }
    }
    check(l, XXH3_64bits_digest(&state));
  }
};

int open_regular_file(int dir_fd, const std::string& name, const std::string& path, struct stat& st) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) fail(path + ": is a symbolic link (refused)");
    if (errno == ENOENT) fail(path + ": missing (not an image, or an unfinished one)");
    fail(path + ": cannot open: " + errno_text(errno));
  }
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path + ": cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path + ": not a regular file (refused)");
  }
  return fd;
}

namespace {

// A writer renames its temporary directory into place only once everything is on disk; a
// staging directory (staging_name.hpp) is what an interrupted dump leaves, even when its files look complete.
void refuse_unfinished(const std::filesystem::path& dir) {
  std::filesystem::path name = std::filesystem::absolute(dir).lexically_normal();
  if (!name.has_filename()) name = name.parent_path();
  if (is_staging_name(name.filename().string()))
    fail(dir.string() + ": an unfinished image (its dump did not complete); it can be deleted");
}

// The manifest's text, bounded in size.
std::string read_manifest_text(int dir_fd, const std::string& manifest_path) {
  struct stat st;
  fd_guard mfd{open_regular_file(dir_fd, std::string(detail::manifest_name), manifest_path, st)};
  if (static_cast<std::uint64_t>(st.st_size) > detail::max_manifest_bytes)
    fail(manifest_path + ": " + std::to_string(st.st_size) + " bytes, larger than the " +
         std::to_string(detail::max_manifest_bytes) + " a manifest may have");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  if (!text.empty()) pread_all(mfd.fd, text.data(), text.size(), 0, manifest_path);
  return text;
}

// Format 3: the tables, checked against the manifest's account of them before they are decoded.
void read_tables(int dir_fd, const std::filesystem::path& dir, detail::manifest_file& decoded) {
  const std::string tables_path = (dir / detail::tables_name).string();
  struct stat st;
  fd_guard tfd{open_regular_file(dir_fd, std::string(detail::tables_name), tables_path, st)};
  if (static_cast<std::uint64_t>(st.st_size) != decoded.tables_bytes)
    fail(tables_path + ": " + std::to_string(st.st_size) + " bytes, the manifest says " +
         std::to_string(decoded.tables_bytes));
  std::string tables(static_cast<std::size_t>(st.st_size), '\0');
  if (!tables.empty()) pread_all(tfd.fd, tables.data(), tables.size(), 0, tables_path);
  const std::uint64_t checksum = XXH3_64bits(tables.data(), tables.size());
  if (checksum != decoded.tables_checksum)
    fail(tables_path + ": checksum mismatch (manifest " + hex16(decoded.tables_checksum) + ", file " + hex16(checksum) +
         "): the tables were changed after the image was written");
  try {
    detail::decode_tables(tables, decoded.allocation_counts, decoded.extent_counts, decoded.m);
  } catch (const image_error& e) {
    fail(tables_path + ": " + e.what());
  }
}

// The manifest, parsed, then checked rule by rule; `checksum`: that of its text as read.
manifest read_manifest(int dir_fd, const std::filesystem::path& dir, std::uint64_t& checksum) {
  const std::string manifest_path = (dir / detail::manifest_name).string();
  detail::manifest_file decoded;
  {
    const std::string text = read_manifest_text(dir_fd, manifest_path);
    checksum = XXH3_64bits(text.data(), text.size());
    try {
      decoded = detail::decode_manifest_file(text);
    } catch (const image_error& e) {
      fail(manifest_path + ": " + e.what());
    }
  }  // a big manifest's text is not kept beside its decoded tables
  if (decoded.tables_apart) read_tables(dir_fd, dir, decoded);
  try {
    validate(decoded.m);
  } catch (const image_error& e) {
    fail(manifest_path + ": " + e.what());
  }
  return std::move(decoded.m);
}

}  // namespace

// Each data file: header first, then its exact size.
void reader::impl::open_data_files(int dir_fd) {
  std::vector<std::uint64_t> payloads(info.data_files, 0);
  for (const pool& p : info.pools)
    for (const extent& e : p.extents)
      payloads[e.file] +=
          info.format >= 5 ? bytes_here(e, info.block_size) : e.stored;  // validate() keeps these from overflowing
  for (std::uint32_t k = 0; k < info.data_files; ++k) open_data_file(dir_fd, k, payloads[k]);
}

void reader::impl::open_data_file(int dir_fd, std::uint32_t k, std::uint64_t payload) {
  const std::string file_name = detail::data_file_name(k);
  data_paths.push_back((dir / file_name).string());
  const std::string& path = data_paths.back();
  struct stat st;
  data_fds.push_back(open_regular_file(dir_fd, file_name, path, st));
  const int fd = data_fds.back();
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < detail::data_header_size)
    fail(path + ": truncated: " + std::to_string(file_size) + " bytes, shorter than its " +
         std::to_string(detail::data_header_size) + "-byte header");
  detail::header_bytes header;
  pread_all(fd, header.data(), header.size(), 0, path);
  if (std::string why = detail::check_data_header(header, payload, info.format, k, info.data_files); !why.empty())
    fail(path + ": " + why);
  recorded_manifest_checksums.push_back(detail::header_manifest_checksum(header));
  const std::uint64_t expected = detail::data_header_size + payload;
  if (file_size < expected)
    fail(path + ": truncated: " + std::to_string(file_size) + " bytes, expected " + std::to_string(expected) +
         " (64-byte header + its extents)");
  if (file_size > expected)
    fail(path + ": " + std::to_string(file_size) + " bytes, expected " + std::to_string(expected) +
         " (64-byte header + its extents): unexpected bytes after the payload");
}

void reader::impl::index_by_place() {
  for (std::size_t p = 0; p < info.pools.size(); ++p)
    for (std::size_t k = 0; k < info.pools[p].extents.size(); ++k) {
      const extent& e = info.pools[p].extents[k];
      by_place.push_back({e.file, e.offset, e.addr, p, k});
    }
  std::sort(by_place.begin(), by_place.end());
}

reader reader::open(const std::filesystem::path& dir) {
  std::vector<std::string> children;
  return open_link(dir, children);
}

reader reader::open_link(const std::filesystem::path& dir, std::vector<std::string>& children) {
  auto r = std::make_unique<impl>();
  r->dir = dir;
  refuse_unfinished(dir);
  fd_guard dir_fd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir_fd.fd < 0) fail(dir.string() + ": cannot open the image directory: " + errno_text(errno));
  r->info = read_manifest(dir_fd.fd, dir, r->manifest_checksum);
  r->open_data_files(dir_fd.fd);
  r->index_by_place();
  if (r->info.parent) r->open_parent(children);
  return reader(std::move(r));
}

reader::reader(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
reader::reader(reader&&) noexcept = default;
reader::~reader() = default;

const manifest& reader::info() const { return impl_->info; }

void reader::read(const extent& e, void* dst) const {
  impl_->read_checked(impl_->locate(e), static_cast<unsigned char*>(dst), true, nullptr);
}

void reader::read_part(const extent& e, std::uint64_t offset, std::uint64_t size, void* dst) const {
  const auto& l = impl_->locate(e);
  const extent& known = impl_->info.pools[l.pool].extents[l.index];
  if (offset > known.stored || size > known.stored - offset)
    fail(impl_->data_paths[known.file] + ": read past the end of the extent at " + hex(known.addr));
  impl_->read_stored(l, offset, size, static_cast<unsigned char*>(dst));
}

std::uint64_t reader::manifest_checksum() const { return impl_->manifest_checksum; }
const reader* reader::parent() const { return impl_->parent.get(); }
const std::filesystem::path& reader::dir() const { return impl_->dir; }

void reader::read_range(std::uint64_t addr, std::uint64_t size,
                        const std::function<void(const unsigned char*, std::size_t)>& out) const {
  const manifest& m = impl_->info;
  const std::uint64_t end = addr + size;
  auto missing = [&](std::uint64_t at) {
    fail(impl_->dir.string() + ": byte " + hex(at) + " is not in the image (no allocation of it holds it; asked for " +
         hex(addr) + " + " + std::to_string(size) + " bytes)");
  };
  if (size == 0) return;
  if (end < addr) missing(addr);
  const pool* in = nullptr;
  for (const pool& p : m.pools)
    if (addr >= p.base && addr - p.base < p.size) in = &p;
  if (in == nullptr) missing(addr);
  const pool& p = *in;
  // The whole range must be in allocations before a byte goes out: a hole is named, not skipped.
  auto a = std::upper_bound(p.allocations.begin(), p.allocations.end(), addr,
                            [](std::uint64_t at, const allocation& x) { return at < x.addr + x.size; });
  for (std::uint64_t at = addr; at < end; ++a) {
    if (a == p.allocations.end() || a->addr > at) missing(at);
    at = a->addr + a->size;  // validate() keeps this from overflowing
  }
  // Each extent touched is read whole (what its checksum covers) and checked, then the parts of its
  // runs inside the range go out.
  auto e = std::upper_bound(p.extents.begin(), p.extents.end(), addr,
                            [](std::uint64_t at, const extent& x) { return at < x.addr + x.size; });
  std::vector<unsigned char> bytes;
  for (; e != p.extents.end() && e->addr < end; ++e) {
    bytes.resize(e->stored);
    read(*e, bytes.data());
    for (const stored_run& r : stored_runs(p, *e)) {
      const std::uint64_t from = std::max(addr, r.addr), to = std::min(end, r.addr + r.size);
      if (from < to) out(bytes.data() + r.offset + (from - r.addr), to - from);
    }
  }
}

void reader::check_extent(const extent& e, std::uint64_t computed) const { impl_->check(impl_->locate(e), computed); }

void reader::verify_manifest() const {
  if (impl_->parent) impl_->parent->verify_manifest();
  for (std::size_t k = 0; k < impl_->recorded_manifest_checksums.size(); ++k)
    if (impl_->manifest_checksum != impl_->recorded_manifest_checksums[k])
      fail((impl_->dir / std::string(detail::manifest_name)).string() + ": checksum mismatch (" +
           detail::data_file_name(static_cast<std::uint32_t>(k)) + "'s header records " +
           hex(impl_->recorded_manifest_checksums[k]) + ", the manifest hashes to " + hex(impl_->manifest_checksum) +
           "): the manifest was changed after the image was written");
}

std::vector<std::pair<std::size_t, std::size_t>> reader::extents_across_files() const {
  // by_place is sorted by (file, offset): one cursor per file, taken in turn.
  std::vector<std::pair<std::size_t, std::size_t>> runs;  // each file's [begin, end) in by_place
  const auto& places = impl_->by_place;
  for (std::size_t i = 0; i < places.size(); ++i)
    if (i == 0 || places[i].file != places[i - 1].file) runs.emplace_back(i, i);
  for (std::size_t r = 0; r < runs.size(); ++r)
    runs[r].second = r + 1 < runs.size() ? runs[r + 1].first : places.size();
  std::vector<std::pair<std::size_t, std::size_t>> order;
  order.reserve(places.size());
  while (order.size() < places.size())
    for (auto& [at, end] : runs)
      if (at < end) {
        order.emplace_back(places[at].pool, places[at].index);
        ++at;
      }
  return order;
}

void reader::verify_data(unsigned threads) const {
  verify_manifest();
  const auto order = extents_across_files();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::max<std::size_t>(1, std::min<std::size_t>(threads, order.size())));
  for (int fd : impl_->data_fds) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  // Extents are taken one at a time by the next free thread; the first error is reported.
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&] {
    try {
      auto buffer = std::make_unique_for_overwrite<unsigned char[]>(2 * read_piece);
      detail::background_hasher hasher;
      for (std::size_t k; (k = next++) < order.size();) {
        {
          std::lock_guard lock(mu);
          if (error) return;
        }
        const extent& e = impl_->info.pools[order[k].first].extents[order[k].second];
        impl_->read_checked(impl_->locate(e), buffer.get(), false, &hasher);
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace vmmckpt::image
