// Writes an image under a temporary name: one or more data files appended in parallel, per-extent XXH3, fsync, atomic rename.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "image_detail.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::image {
namespace {

using detail::errno_text;
using detail::fail;

// Large enough that a write() costs little next to the copy, small enough to stay cache-friendly.
constexpr std::size_t buffer_capacity = 8u << 20;
// Hashed and written together: small enough to stay in a core's cache between the two. Pieces of at
// least this size are written straight from the caller's memory: gathering them first would move
// every byte through memory once more (a dump whose block checksums come from the GPU writes runs
// of whole blocks, each at least this size, or an extent's last, shorter one).
constexpr std::size_t hash_piece = 1u << 20;

// Writes every byte of iov[0..n) or throws naming `file`; handles short writes and EINTR.
void write_all(int fd, iovec* iov, int n, const std::string& file) {
  while (n > 0) {
    const ssize_t w = ::writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(file + ": write failed: " + errno_text(errno));
    }
    if (w == 0) fail(file + ": write failed: wrote nothing");
    auto left = static_cast<std::size_t>(w);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

void pwrite_all(int fd, const void* data, std::size_t size, off_t offset, const std::string& file) {
  auto p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::pwrite(fd, p, size, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(file + ": write failed: " + errno_text(errno));
    }
    if (w == 0) fail(file + ": write failed: wrote nothing");
    p += w;
    size -= static_cast<std::size_t>(w);
    offset += w;
  }
}

void fsync_or_fail(int fd, const std::string& what) {
  if (::fsync(fd) != 0) fail(what + ": fsync failed: " + errno_text(errno));
}

void close_or_fail(int& fd, const std::string& what) {
  const int f = fd;
  fd = -1;
  // Some file systems (NFS) report deferred write errors only here; EINTR still closed the fd.
  if (::close(f) != 0 && errno != EINTR) fail(what + ": close failed: " + errno_text(errno));
}

}  // namespace

// One data file: its descriptor, the bytes gathered for the next write, and its extents.
struct data_file {
  int fd = -1;
  std::string path;
  std::unique_ptr<unsigned char[]> buffer;  // allocated by the first small write
  std::size_t buffered = 0;
  std::uint64_t payload = 0;  // bytes of extents accepted so far (written or buffered)
  bool in_extent = false;
  extent current;
  std::uint64_t current_written = 0;      // stored bytes of the current extent accepted (written or inherited)
  std::optional<streaming_checksum> sum;  // the current extent's blocks (image_blocks.cpp: the one definition)
  std::vector<extent> written;
  writer::file_times times;

  // `size` bytes from a block boundary of the current extent: one block (write_block_size or the extent's
  // last, shorter, block), or with `run` any number of whole blocks, the last one shorter only at the end.
  void check_blocks(const char* op, std::size_t size, bool run) const {
    if (!in_extent) fail(std::string(op) + ": no extent was begun");
    if (!sum->at_block_boundary())
      fail(std::string(op) + ": the extent at " + hex(current.addr) + " is inside a block");
    const std::uint64_t left = current.stored - current_written;
    const bool fits =
        run ? size <= left && (size % write_block_size == 0 || size == left) : size == std::min(left, write_block_size);
    if (!fits || size == 0)
      fail(std::string(op) + ": " + std::to_string(size) + " bytes are not " +
           (run ? "whole blocks" : "the next block") + " of the extent at " + hex(current.addr) + " (" +
           std::to_string(left) + " bytes left)");
  }

  void add_zero_block(std::uint64_t size) {
    sum->add_block({zero_block_checksum(size), false, true});
    current_written += size;
  }

  // Stores `size` bytes of the current extent (their block checksums in `checksums`, one a block, when the
  // caller computed them: then they start at a block boundary): every whole block of zeros among them becomes
  // a zero block, the rest is stored as given.
  void store(const unsigned char* p, std::size_t size, const std::uint64_t* checksums = nullptr) {
    while (size > 0) {
      std::size_t run = 0, run_blocks = 0;  // what is not a whole zero block: stored with one append
      while (run < size) {
        const std::uint64_t at = current_written + run;
        const std::uint64_t block = std::min((at / write_block_size + 1) * write_block_size, current.stored) - at;
        if (at % write_block_size == 0 && size - run >= block && detail::all_zero(p + run, block)) break;
        run += static_cast<std::size_t>(std::min<std::uint64_t>(block, size - run));
        ++run_blocks;
      }
      if (run == 0) {  // a whole zero block
        const std::uint64_t block = std::min(write_block_size, current.stored - current_written);
        add_zero_block(block);
        if (checksums != nullptr) ++checksums;
        p += block;
        size -= static_cast<std::size_t>(block);
        continue;
      }
      append(p, run, checksums != nullptr);
      if (checksums != nullptr)
        for (std::size_t k = 0; k < run_blocks; ++k) sum->add_block({*checksums++, false});
      current_written += run;
      payload += run;
      p += run;
      size -= run;
    }
  }

  void flush() {
    if (buffered == 0) return;
    iovec iov{buffer.get(), buffered};
    timed(times.writing, [&] { write_all(fd, &iov, 1, path); });
    buffered = 0;
  }

  template <typename F>
  static void timed(double& seconds, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Stores bytes of the current extent, hashing them unless `hashed` (their block checksums are
  // known): pieces of a hash_piece or more straight from the caller's memory, smaller ones gathered
  // so that each write() moves a useful amount.
  void append(const unsigned char* p, std::size_t size, bool hashed = false) {
    if (size >= hash_piece) {
      flush();
      if (hashed) {  // nothing to hash here: one write()
        iovec iov{const_cast<unsigned char*>(p), size};
        timed(times.writing, [&] { write_all(fd, &iov, 1, path); });
        return;
      }
      // Each piece is written while the hash has just brought it into the cache: memory is
      // read once instead of twice.
      while (size > 0) {
        const std::size_t n = std::min(size, hash_piece);
        if (!hashed) timed(times.hashing, [&] { sum->update(p, n); });
        iovec iov{const_cast<unsigned char*>(p), n};
        timed(times.writing, [&] { write_all(fd, &iov, 1, path); });
        p += n;
        size -= n;
      }
      return;
    }
    if (!hashed) timed(times.hashing, [&] { sum->update(p, size); });
    if (!buffer) buffer = std::make_unique_for_overwrite<unsigned char[]>(buffer_capacity);
    while (size > 0) {
      const std::size_t n = std::min(size, buffer_capacity - buffered);
      std::memcpy(buffer.get() + buffered, p, n);
      buffered += n;
      p += n;
      size -= n;
      if (buffered == buffer_capacity) flush();
    }
  }
};

struct writer::impl {
  std::string image_id = random_hex16() + random_hex16();  // 128 random bits, 32 hex digits
  std::filesystem::path final_dir, temp_dir;
  std::string final_name, temp_name;
  int parent_fd = -1, dir_fd = -1;
  bool dir_created = false, committed = false;
  std::atomic<bool> failed{false};
  std::vector<std::unique_ptr<data_file>> files;
  std::vector<std::pair<std::string, std::string>> extra_files;  // add_file's, written at commit

  std::string manifest_path() const { return (temp_dir / detail::manifest_name).string(); }

  void create(const std::filesystem::path& final_path, std::uint32_t file_count) {
    if (file_count == 0 || file_count > max_data_files)
      fail(final_path.string() + ": " + std::to_string(file_count) + " data files asked for, expected 1 to " +
           std::to_string(max_data_files));
    name_image(final_path);
    make_temp_dir();
    for (std::uint32_t k = 0; k < file_count; ++k) create_data_file(k, file_count);
  }

  // The image's final directory and name, and its parent directory opened: refused where the name is not
  // one an image may have, or is taken.
  void name_image(const std::filesystem::path& final_path) {
    std::filesystem::path f = final_path;
    if (!f.has_filename()) f = f.parent_path();  // "dir/img/" names "dir/img"
    final_dir = f;
    final_name = f.filename().string();
    if (final_name.empty() || final_name == "." || final_name == "..")
      fail(final_path.string() + ": not a usable image directory name");
    // Readers take such names for interrupted dumps (see reader::open).
    if (is_staging_name(final_name))
      fail(final_path.string() + ": an image name must not contain \"" + std::string(staging_marker) + "\"");
    const std::filesystem::path parent = f.has_parent_path() ? f.parent_path() : std::filesystem::path(".");
    parent_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent_fd < 0) fail(parent.string() + ": cannot open the directory for the image: " + errno_text(errno));
    struct stat st;
    if (::fstatat(parent_fd, final_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      fail(final_dir.string() + ": already exists");
    if (errno != ENOENT) fail(final_dir.string() + ": " + errno_text(errno));
  }

  // The temporary directory the image is written in, beside its final place, only its owner's.
  void make_temp_dir() {
    // Retried because the random part could, very rarely, name a leftover of another dump.
    for (int attempt = 0;; ++attempt) {
      temp_name = staging_name(final_name);
      temp_dir = final_dir.has_parent_path() ? final_dir.parent_path() / temp_name : std::filesystem::path(temp_name);
      if (::mkdirat(parent_fd, temp_name.c_str(), 0700) == 0) break;
      if (errno != EEXIST || attempt == 8)
        fail(temp_dir.string() + ": cannot create the temporary image directory: " + errno_text(errno));
    }
    dir_created = true;
    dir_fd = ::openat(parent_fd, temp_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir_fd < 0) fail(temp_dir.string() + ": cannot open: " + errno_text(errno));
    // mkdir's mode is filtered by the umask; images hold program memory, so make it exact.
    if (::fchmod(dir_fd, 0700) != 0) fail(temp_dir.string() + ": chmod failed: " + errno_text(errno));
  }

  // Data file k of `count`, its header saying no payload yet.
  void create_data_file(std::uint32_t k, std::uint32_t count) {
    auto df = std::make_unique<data_file>();
    const std::string name = detail::data_file_name(k);
    df->path = (temp_dir / name).string();
    df->fd = ::openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (df->fd < 0) fail(df->path + ": cannot create: " + errno_text(errno));
    files.push_back(std::move(df));
    data_file& d = *files.back();
    if (::fchmod(d.fd, 0600) != 0) fail(d.path + ": chmod failed: " + errno_text(errno));
    // The real payload size is patched in by commit(); until then the header says 0.
    auto header = detail::encode_data_header(0, 0, k, count);
    iovec iov{header.data(), header.size()};
    write_all(d.fd, &iov, 1, d.path);
  }

  void usable(const char* op) const {
    if (committed) fail(std::string(op) + ": the image is already committed");
    if (failed) fail(std::string(op) + ": the writer is unusable after an earlier error");
  }

  data_file& file(const char* op, std::uint32_t k) {
    usable(op);
    if (k >= files.size())
      fail(std::string(op) + ": data file " + std::to_string(k) + " of " + std::to_string(files.size()) +
           " does not exist");
    return *files[k];
  }

  // Refusals here leave the writer usable: the caller may commit again with a corrected manifest.
  void check(const manifest& m) const {
    usable("commit");
    for (const auto& f : files)
      if (f->in_extent) fail("commit: the extent at " + hex(f->current.addr) + " was not ended");
    try {
      validate(m);
    } catch (const image_error& e) {
      fail("commit refused, the manifest is invalid: " + std::string(e.what()));
    }
    if (m.format != format_version)
      fail("commit refused: the manifest says format " + std::to_string(m.format) + ", the writer writes " +
           std::to_string(format_version));
    if (m.block_size != write_block_size)
      fail("commit refused: the manifest says block_size " + std::to_string(m.block_size) + ", the writer writes " +
           std::to_string(write_block_size));
    if (m.data_files != files.size())
      fail("commit refused: the manifest says " + std::to_string(m.data_files) + " data files, the writer has " +
           std::to_string(files.size()));
    std::vector<std::size_t> seen(files.size(), 0);
    for (std::size_t p = 0; p < m.pools.size(); ++p)
      for (std::size_t k = 0; k < m.pools[p].extents.size(); ++k) {
        const extent& e = m.pools[p].extents[k];
        const auto& written = files[e.file]->written;  // validate() checked e.file
        const std::size_t n = seen[e.file]++;
        if (n >= written.size())
          fail("commit refused: the manifest lists more extents in data file " + std::to_string(e.file) + " than the " +
               std::to_string(written.size()) + " written");
        const extent& w = written[n];
        if (e.addr != w.addr || e.size != w.size || e.stored != w.stored || e.offset != w.offset ||
            e.checksum != w.checksum || e.blocks != w.blocks)
          fail("commit refused: " + detail::extent_name(p, k) + " (" + hex(e.addr) + "+" + std::to_string(e.size) +
               ") is not extent " + std::to_string(n) + " of data file " + std::to_string(e.file) + " as written (" +
               hex(w.addr) + "+" + std::to_string(w.size) + ")");
      }
    for (std::size_t f = 0; f < files.size(); ++f)
      if (seen[f] != files[f]->written.size())
        fail("commit refused: the manifest lists " + std::to_string(seen[f]) + " extents in data file " +
             std::to_string(f) + ", " + std::to_string(files[f]->written.size()) + " were written");
  }

  // A file of the image, created, written whole, synced and closed.
  void write_member(std::string_view name, const std::string& bytes) {
    const std::string path = (temp_dir / name).string();
    int fd = ::openat(dir_fd, std::string(name).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) fail(path + ": cannot create: " + errno_text(errno));
    try {
      if (::fchmod(fd, 0600) != 0) fail(path + ": chmod failed: " + errno_text(errno));
      iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
      write_all(fd, &iov, 1, path);
      fsync_or_fail(fd, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    close_or_fail(fd, path);
  }

  std::uint64_t write_out(const manifest& m) {
    // The tables first, so that the manifest can record their size and checksum, and the data files'
    // headers the manifest's: the chain of checksums covers every byte of metadata.
    const metadata_files files_of_m = encode_metadata(m);
    const std::string& tables = files_of_m.tables;
    const std::string& text = files_of_m.manifest_json;
    const std::uint64_t manifest_checksum = XXH3_64bits(text.data(), text.size());
    for (const auto& [name, contents] : extra_files) write_member(name, contents);
    write_member(detail::tables_name, tables);
    for (std::uint32_t k = 0; k < files.size(); ++k) {
      data_file& d = *files[k];
      d.flush();
      const auto header =
          detail::encode_data_header(d.payload, manifest_checksum, k, static_cast<std::uint32_t>(files.size()));
      pwrite_all(d.fd, header.data(), header.size(), 0, d.path);
      fsync_or_fail(d.fd, d.path);
      close_or_fail(d.fd, d.path);
    }

    write_member(detail::manifest_name, text);
    // The directory entries must be durable before the name makes them visible as an image.
    fsync_or_fail(dir_fd, temp_dir.string());

    fault_point("renaming");  // complete and synced, not yet an image: what a crash here leaves
    rename_into_place();
    committed = true;
    const std::filesystem::path parent = final_dir.has_parent_path() ? final_dir.parent_path() : ".";
    fsync_or_fail(parent_fd, parent.string() + " (after renaming the image into place)");
    return manifest_checksum;
  }

  void rename_into_place() {
    const auto exists_error = [&] {
      fail(final_dir.string() + ": already exists (it appeared while the image was written)");
    };
#ifdef RENAME_NOREPLACE
    if (::renameat2(parent_fd, temp_name.c_str(), parent_fd, final_name.c_str(), RENAME_NOREPLACE) == 0) return;
    if (errno == EEXIST) exists_error();
    // File systems without RENAME_NOREPLACE answer EINVAL; old kernels ENOSYS.
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
      fail(temp_dir.string() + ": cannot rename to " + final_dir.string() + ": " + errno_text(errno));
#endif
    // rename() would replace an empty directory silently: check first (a small race remains).
    struct stat st;
    if (::fstatat(parent_fd, final_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) exists_error();
    if (::renameat(parent_fd, temp_name.c_str(), parent_fd, final_name.c_str()) != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY) exists_error();
      fail(temp_dir.string() + ": cannot rename to " + final_dir.string() + ": " + errno_text(errno));
    }
  }

  ~impl() {
    for (const auto& f : files)
      if (f->fd >= 0) ::close(f->fd);
    if (!committed && dir_created) {
      if (dir_fd >= 0) {
        for (std::uint32_t k = 0; k < files.size(); ++k) ::unlinkat(dir_fd, detail::data_file_name(k).c_str(), 0);
        ::unlinkat(dir_fd, detail::manifest_name.data(), 0);
        ::unlinkat(dir_fd, detail::tables_name.data(), 0);
        for (const auto& f : extra_files) ::unlinkat(dir_fd, f.first.c_str(), 0);
      }
      ::unlinkat(parent_fd, temp_name.c_str(), AT_REMOVEDIR);
    }
    if (dir_fd >= 0) ::close(dir_fd);
    if (parent_fd >= 0) ::close(parent_fd);
  }
};

writer::writer(const std::filesystem::path& final_dir, std::uint32_t files) : impl_(std::make_unique<impl>()) {
  // On failure impl_'s destructor removes whatever create() made.
  impl_->create(final_dir, files);
}

writer::~writer() = default;

const std::string& writer::image_id() const { return impl_->image_id; }

void writer::add_file(const std::string& name, const std::string& contents) {
  impl_->usable("add_file");
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
      name == detail::manifest_name || name == detail::tables_name || name.rfind("data.", 0) == 0)
    fail("add_file: \"" + name + "\" is not a name an image may take");
  impl_->extra_files.emplace_back(name, contents);
}

metadata_files encode_metadata(const manifest& m) {
  metadata_files out;
  out.tables = detail::encode_tables(m);
  out.manifest_json =
      detail::encode_manifest_file(m, out.tables.size(), XXH3_64bits(out.tables.data(), out.tables.size()));
  return out;
}

std::uint32_t writer::files() const { return static_cast<std::uint32_t>(impl_->files.size()); }

writer::file_times writer::times(std::uint32_t file) const {
  return file < impl_->files.size() ? impl_->files[file]->times : file_times{};
}

void writer::begin_extent(std::uint32_t file, std::uint64_t addr, std::uint64_t size, std::uint64_t stored) {
  impl& w = *impl_;
  data_file& f = w.file("begin_extent", file);
  try {
    if (f.in_extent) fail("begin_extent: the extent at " + hex(f.current.addr) + " is still open");
    if (size == 0 || stored == 0) fail("begin_extent: the extent at " + hex(addr) + " is empty");
    if (stored > size)
      fail("begin_extent: the extent at " + hex(addr) + " cannot store " + std::to_string(stored) + " bytes of a " +
           std::to_string(size) + "-byte range");
    f.current = extent{addr, size, stored, file, f.payload, 0, {}};
    f.current_written = 0;
    f.sum.emplace(write_block_size);
    f.in_extent = true;
  } catch (...) {
    w.failed = true;
    throw;
  }
}

void writer::write(std::uint32_t file, const void* data, std::size_t size) {
  impl& w = *impl_;
  data_file& f = w.file("write", file);
  try {
    if (!f.in_extent) fail("write: no extent was begun");
    if (size > f.current.stored - f.current_written)
      fail("write: " + std::to_string(size) + " bytes overflow the extent at " + hex(f.current.addr) + " (" +
           std::to_string(f.current.stored - f.current_written) + " bytes left)");
    if (size == 0) return;
    f.store(static_cast<const unsigned char*>(data), size);
  } catch (...) {
    w.failed = true;
    throw;
  }
}

void writer::write_block(std::uint32_t file, const void* data, std::size_t size, std::uint64_t checksum) {
  write_blocks(file, data, size, &checksum, 1);
}

void writer::write_blocks(std::uint32_t file, const void* data, std::size_t size, const std::uint64_t* checksums,
                          std::size_t count) {
  impl& w = *impl_;
  data_file& f = w.file("write_blocks", file);
  try {
    f.check_blocks("write_blocks", size, count != 1);
    if (count != block_count(size, write_block_size))
      fail("write_blocks: " + std::to_string(count) + " checksums for " + std::to_string(size) + " bytes");
    f.store(static_cast<const unsigned char*>(data), size, checksums);
  } catch (...) {
    w.failed = true;
    throw;
  }
}

void writer::inherit_block(std::uint32_t file, std::size_t size, std::uint64_t checksum) {
  impl& w = *impl_;
  data_file& f = w.file("inherit_block", file);
  try {
    f.check_blocks("inherit_block", size, false);
    f.sum->add_block({checksum, true});
    f.current_written += size;
  } catch (...) {
    w.failed = true;
    throw;
  }
}

void writer::zero_block(std::uint32_t file, std::size_t size) {
  impl& w = *impl_;
  data_file& f = w.file("zero_block", file);
  try {
    f.check_blocks("zero_block", size, false);
    f.add_zero_block(size);
  } catch (...) {
    w.failed = true;
    throw;
  }
}

extent writer::end_extent(std::uint32_t file) {
  impl& w = *impl_;
  data_file& f = w.file("end_extent", file);
  try {
    if (!f.in_extent) fail("end_extent: no extent was begun");
    if (f.current_written != f.current.stored)
      fail("end_extent: the extent at " + hex(f.current.addr) + " got " + std::to_string(f.current_written) +
           " of its " + std::to_string(f.current.stored) + " bytes");
    f.current.blocks = f.sum->blocks();
    f.current.checksum = combined_checksum(f.current.blocks);
    f.in_extent = false;
    f.written.push_back(f.current);
    return f.current;
  } catch (...) {
    w.failed = true;
    throw;
  }
}

std::uint64_t writer::commit(const manifest& given) {
  // A copy only when the caller's image_id is not the writer's already: a manifest of a million
  // allocations is 24 MB.
  std::optional<manifest> copy;
  if (given.image_id != impl_->image_id) {
    copy.emplace(given);
    copy->image_id = impl_->image_id;
  }
  const manifest& m = copy ? *copy : given;
  impl_->check(m);
  try {
    return impl_->write_out(m);
  } catch (...) {
    impl_->failed = true;
    throw;
  }
}

const std::filesystem::path& writer::temporary_dir() const { return impl_->temp_dir; }

}  // namespace vmmckpt::image
