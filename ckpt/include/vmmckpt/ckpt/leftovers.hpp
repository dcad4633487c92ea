// What crashed or killed tools leave behind, found and removed only when no process depends on it: `cuda-ckpt gc`.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace vmmckpt::ckpt {

// Where suspend puts images by default: a private directory of this user's on /dev/shm (created,
// and checked to be ours and closed to others; a tool_error otherwise).
std::filesystem::path default_suspend_dir();

struct leftover {
  std::filesystem::path path;
  std::string why;  // why it can go, or why it stays
};

struct leftovers_report {
  std::vector<leftover> removed;
  std::vector<leftover> kept;  // suspend images a process depends on, or may: they stay
};

// Scans `dirs` (the default suspend directory when empty) and the runtime directory, and removes:
// - unfinished images (NAME.partial-PID-...) whose writer is gone;
// - suspend images nobody depends on: withdrawn ones, ones whose tool died before the program took
//   them (the claim is withdrawn here first, so that the program can never take it after), and ones
//   whose program is gone, or has been resumed, or is suspended on another image;
// - control sockets of processes that are gone (sockets only: no other file).
// An image whose program does not answer (stopped, busy) stays, as does anything this tool cannot
// tell. With `dry_run` nothing is removed.
leftovers_report collect_leftovers(const std::vector<std::filesystem::path>& dirs, bool dry_run = false);

}  // namespace vmmckpt::ckpt
