#include "image_access.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vmmckpt::tools {

std::string unreadable_image_directory(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  if (::access(path.c_str(), R_OK | X_OK) != 0) return std::strerror(errno);
  return {};
}

}  // namespace vmmckpt::tools
