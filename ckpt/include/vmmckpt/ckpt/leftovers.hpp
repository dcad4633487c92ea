// What crashed or killed tools leave behind, found and removed only when no process depends on it: `cuda-ckpt gc`.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace vmmckpt::ckpt {

struct leftover {
  std::filesystem::path path;
  std::string why;  // why it can go, or why it stays
};

struct leftovers_report {
  std::vector<leftover> removed;
  std::vector<leftover> kept;     // suspend images a process depends on, or may: they stay
  std::vector<leftover> skipped;  // what this user cannot read (another user's image): left as it is
};

// An image whose process is gone, which `cuda-ckpt gc` removes: a suspend image whose program died
// (or whose tool died before the program took it, or that its tool withdrew), or an unfinished image
// whose writer died. What `cuda-ckpt ps` lists as orphaned.
struct orphaned_image {
  std::filesystem::path path;
  pid_t pid = 0;            // the program it belonged to (the writer for an unfinished image)
  std::uint64_t bytes = 0;  // what it takes on its file system
  std::string why;
};

// The default suspend directories to look at: ours, or every user's for root (/dev/shm/vmmckpt-UID,
// owned by UID). None is created.
std::vector<std::filesystem::path> suspend_dirs_of_all_users();
// The orphaned images in `dirs`, judged as gc judges them; nothing removed, no process asked.
std::vector<orphaned_image> find_orphaned_images(const std::vector<std::filesystem::path>& dirs);
// The command that removes the leftovers of `dir`: "cuda-ckpt gc" for our default suspend directory.
std::string gc_command_for(const std::filesystem::path& dir);

// Scans `dirs` (the default suspend directory when empty) and the runtime directory, and removes:
// - unfinished images (NAME.partial-PID-...) whose writer is gone;
// - suspend images nobody depends on: withdrawn ones, ones whose tool died before the program took
//   them (the claim is withdrawn here first, so that the program can never take it after), and ones
//   whose program is gone, or has been resumed, or is suspended on another image;
// - control sockets of processes that are gone (remove_stale_sockets).
// An image whose program does not answer (stopped, busy) stays, as does anything this tool cannot
// tell. What this user cannot read is skipped (in `skipped`, with why) and the scan goes on. With `dry_run`
// nothing is removed.
leftovers_report collect_leftovers(const std::vector<std::filesystem::path>& dirs, bool dry_run = false);

// Removes the socket files in our runtime directory that nobody listens at (their connection is
// refused: the process is gone, or its pid now belongs to another program). Never anything but a
// socket, never one a process answers or may answer.
void remove_stale_sockets(bool dry_run, leftovers_report& report);

}  // namespace vmmckpt::ckpt
