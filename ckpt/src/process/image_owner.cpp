// Whom an image can have been changed by: root restores only what nobody else can have written (docs/security.md).
#include "vmmckpt/ckpt/image_owner.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

std::string user_of(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);
  return "uid " + std::to_string(uid) + (pw != nullptr ? " (" + std::string(pw->pw_name) + ")" : "");
}

// Why someone other than `owner` can change this file or directory, or "".
std::string writable_by_others(const fs::path& path, const struct stat& st, uid_t owner) {
  const std::string shown = json_fields::printable(path.string());
  if (st.st_uid != owner) return shown + " is owned by " + user_of(st.st_uid) + ", not " + user_of(owner);
  if ((st.st_mode & S_IWOTH) != 0) return shown + " is writable by every user";
  if ((st.st_mode & S_IWGRP) != 0) return shown + " is writable by its group (gid " + std::to_string(st.st_gid) + ")";
  return {};
}

// The directories above `dir`: another user who may write one could rename what is below it and put
// another image in its place between the check and the restore. A sticky directory (/tmp) lets only an
// entry's owner rename it.
std::string above(const fs::path& dir, uid_t owner) {
  for (fs::path p = dir.parent_path(); !p.empty(); p = p.parent_path()) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return json_fields::printable(p.string()) + " cannot be read";
    if (st.st_uid != owner && st.st_uid != 0)
      return json_fields::printable(p.string()) + ", a directory above the image, is owned by " + user_of(st.st_uid);
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0)
      return json_fields::printable(p.string()) + ", a directory above the image, is writable by other users";
    if (p == p.root_path()) break;
  }
  return {};
}

// Everything in one image directory (a whole-process image, or one GPU image of a chain) and above it.
std::string distrust_of_dir(const fs::path& dir, uid_t owner) {
  std::string why;
  for_each_entry(dir, [&](const fs::path& path, const struct stat& st) {
    if (why.empty()) why = writable_by_others(path, st, owner);
  });
  return why.empty() ? above(dir, owner) : why;
}

}  // namespace

std::string distrust_of(const fs::path& image) {
  const uid_t owner = ::geteuid();
  std::error_code ec;
  const fs::path dir = fs::canonical(image, ec);
  if (ec) return json_fields::printable(image.string()) + " cannot be resolved: " + ec.message();
  if (std::string why = distrust_of_dir(dir, owner); !why.empty()) return why;
  // The GPU parts' chains: an incremental part takes blocks from its parents, wherever they are.
  // (An image that does not open is refused by the checks that follow, saying why.)
  if (!is_process_image(dir)) return {};
  try {
    const process_image p = read_process_image(dir);
    for (const auto& m : p.processes) {
      const auto reader = image::reader::open(p.gpu_image(dir, m.pid));
      for (const image::reader* r = reader.parent(); r != nullptr; r = r->parent())
        if (std::string why = distrust_of_dir(fs::canonical(r->dir(), ec), owner); !why.empty()) return why;
    }
  } catch (const image::image_error&) {
  }
  return {};
}

}  // namespace vmmckpt::ckpt
