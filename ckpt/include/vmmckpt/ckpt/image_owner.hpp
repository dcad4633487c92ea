// Whom an image can have been changed by: root restores only what nobody else can have written (docs/security.md).
#pragma once

#include <filesystem>
#include <string>

namespace vmmckpt::ckpt {

// Why the image at `image` may have been written by someone other than this tool's user, in words naming the
// file or directory, or "" when it cannot: every file and directory of it (and of every image its GPU parts
// take blocks from) owned by the user and writable by no group or other user, and every directory above
// each owned by the user and writable by no one else unless sticky (/tmp). No symbolic link inside is
// followed. `cuda-ckpt restore` as root refuses an image for which this is not "" unless --trust-owner.
std::string distrust_of(const std::filesystem::path& image);

}  // namespace vmmckpt::ckpt
