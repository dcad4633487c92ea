// Where a command's bytes go (cat, peek): stdout, or a file that appears under its name only when every byte is in
// it (a failed command leaves none), owner-only like the memory it comes from.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::tools {

class byte_sink {
 public:
  explicit byte_sink(const std::string& path) : path_(path) {
    if (path_.empty()) return;
    temp_ = path_ + std::string(image::staging_marker) + std::to_string(::getpid());
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ < 0) throw image::image_error(temp_ + ": cannot create: " + std::strerror(errno));
  }
  ~byte_sink() {
    if (!path_.empty() && fd_ >= 0) {
      ::close(fd_);
      ::unlink(temp_.c_str());
    }
  }
  byte_sink(const byte_sink&) = delete;
  byte_sink& operator=(const byte_sink&) = delete;

  void write(const unsigned char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw image::image_error(name() + ": write failed: " + std::strerror(errno));
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void commit() {
    if (path_.empty()) return;
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(temp_.c_str(), path_.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(temp_.c_str());
      throw image::image_error(path_ + ": cannot complete: " + why);
    }
  }

 private:
  std::string name() const { return path_.empty() ? "stdout" : temp_; }
  std::string path_, temp_;
  int fd_ = STDOUT_FILENO;
};

}  // namespace vmmckpt::tools
