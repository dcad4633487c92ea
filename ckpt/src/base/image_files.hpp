// The small files of image directories the tool writes and reads itself (process.json, job.json): read strictly
// (never through a symbolic link, sizes checked before anything is read), written synced and renamed into place.
// Failures are image::image_error with a printable message naming the path.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace vmmckpt::ckpt::image_files {

// The bounds the readers of the tool's own files share: far above anything the tool writes, so that a damaged or
// hostile file is refused before it costs memory.
inline constexpr std::int64_t pid_limit = 4'194'304;                    // the kernel's PID_MAX_LIMIT
inline constexpr std::uint64_t max_process_manifest_bytes = 16u << 20;  // process.json, intent.json: a few KiB
inline constexpr std::uint64_t max_job_manifest_bytes = 4u << 20;       // job.json, the nodes' manifest
inline constexpr std::size_t max_ranks = 65536;                         // of a job, and its nodes
inline constexpr std::size_t max_processes = 4096;                      // of one process image (IPC children)
inline constexpr std::size_t max_criu_files = 1u << 16;                 // of one process's CRIU part
inline constexpr int max_depth = 64;  // of directories inside an image (CRIU's and ours are 2 deep)

[[noreturn]] void fail(const std::string& what);
std::string errno_text(int e);

// A descriptor closed when this goes.
struct fd_guard {
  int fd = -1;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard();
};

// The image directory as named (a symbolic link the user names it by is followed, as by the GPU reader).
int open_image_dir(const std::filesystem::path& dir);
// A directory inside the image: never through a symbolic link.
int open_inner_dir(int parent_fd, const std::string& name, const std::filesystem::path& path);
// The names in a directory, without "." and "..", sorted.
std::vector<std::string> names_in(int dir_fd, const std::filesystem::path& path);
// The bytes of a small regular file, its size checked against `limit` before any is read.
std::string read_small_file(int dir_fd, const std::string& name, const std::filesystem::path& path,
                            std::uint64_t limit);
// A name of one path component: not empty, not . or .., no slash.
bool plain_name(const std::string& name);
void fsync_path(const std::filesystem::path& path, bool directory);
// Writes name in dir under a temporary name, synced, then renamed over it: a reader sees the old text or the
// new, never part of one; dir is synced after.
void write_synced(const std::filesystem::path& dir, const std::string& name, const std::string& text);
// Renames a complete image directory from its staging name to its final one, replacing nothing (fails when the
// name is taken), and syncs the directory holding it.
void commit_directory(const std::filesystem::path& staging, const std::filesystem::path& final_name);

}  // namespace vmmckpt::ckpt::image_files
