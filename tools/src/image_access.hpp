// Whether this user can read an image directory at all, asked before an image is judged: a directory that
// cannot be read is not a damaged image, and not one of GPU memory only.
#pragma once

#include <string>

namespace vmmckpt::tools {

// Why `path` cannot be read as an image directory ("No such file or directory", "Permission denied",
// "not a directory"), or empty when this user can list it and read what is in it.
std::string unreadable_image_directory(const std::string& path);

}  // namespace vmmckpt::tools
