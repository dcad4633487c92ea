// The small files of image directories the tool writes and reads itself: strict reads, synced writes.
#include "base/image_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::ckpt::image_files {
namespace fs = std::filesystem;
namespace jf = json_fields;

// Every message is printable: names in the image (a CRIU file called "\x1b[2J") are quoted, never replayed.
void fail(const std::string& what) { throw image::image_error(jf::printable(what)); }

std::string errno_text(int e) { return std::strerror(e); }

fd_guard::~fd_guard() {
  if (fd >= 0) ::close(fd);
}

// The image directory as named (a symbolic link the user names it by is followed, as by the GPU reader).
int open_image_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) fail(dir.string() + ": does not exist");
    fail(dir.string() + ": cannot open the image directory: " + errno_text(errno));
  }
  return fd;
}

// A directory inside the image: never through a symbolic link.
int open_inner_dir(int parent_fd, const std::string& name, const fs::path& path) {
  const int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) return fd;
  if (errno == ELOOP) fail(path.string() + ": is a symbolic link (refused)");
  if (errno == ENOTDIR) fail(path.string() + ": not a directory");
  if (errno == ENOENT) fail(path.string() + ": missing (the image is incomplete)");
  fail(path.string() + ": cannot open: " + errno_text(errno));
}

// The names in a directory, without "." and "..", sorted.
std::vector<std::string> names_in(int dir_fd, const fs::path& path) {
  const int copy = ::dup(dir_fd);
  DIR* d = copy >= 0 ? ::fdopendir(copy) : nullptr;
  if (d == nullptr) {
    if (copy >= 0) ::close(copy);
    fail(path.string() + ": cannot list: " + errno_text(errno));
  }
  ::rewinddir(d);
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// The bytes of a small regular file, its size checked before any is read.
std::string read_small_file(int dir_fd, const std::string& name, const fs::path& path, std::uint64_t limit) {
  struct stat st {};
  fd_guard fd(image::open_regular_file(dir_fd, name, path.string(), st));
  if (static_cast<std::uint64_t>(st.st_size) > limit)
    fail(path.string() + ": " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(limit) +
         " it may have");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pread(fd.fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path.string() + ": read failed: " + errno_text(errno));
    if (n == 0) fail(path.string() + ": shorter than its size (changed while read)");
    done += static_cast<std::size_t>(n);
  }
  return text;
}

bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    fail(path.string() + ": fsync failed: " + errno_text(e));
  }
  ::close(fd);
}

// Writes name in dir under a temporary name, synced, then renamed over it: a reader sees the old text or
// the new, never part of one.
void write_synced(const fs::path& dir, const std::string& name, const std::string& text) {
  // A new file of a name of its own, never one found there (a link to another file would be truncated
  // through), nor one another completing process writes at the same time.
  const fs::path temp = dir / ("." + name + "." + random_hex16() + ".tmp");
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail((dir / name).string() + ": cannot be written: " + errno_text(errno));
  std::size_t done = 0;
  int error = 0;
  while (done < text.size() && error == 0) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      error = n < 0 ? errno : ENOSPC;
    else
      done += static_cast<std::size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  ::close(fd);
  if (error == 0 && ::rename(temp.c_str(), (dir / name).c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temp.c_str());
    fail((dir / name).string() + ": cannot be written: " + errno_text(error));
  }
  fsync_path(dir, true);
}


void commit_directory(const fs::path& staging, const fs::path& final_name) {
  // fs::rename would replace an empty directory of that name: nothing is ever replaced.
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_name.c_str(), RENAME_NOREPLACE) != 0) {
    const int e = errno;
    fail("cannot rename " + staging.string() + " to " + final_name.string() + ": " + errno_text(e) +
         (e == EEXIST ? " (something else took that name meanwhile: the image stays under the first)" : ""));
  }
  fsync_path(final_name.parent_path(), true);
}

}  // namespace vmmckpt::ckpt::image_files
