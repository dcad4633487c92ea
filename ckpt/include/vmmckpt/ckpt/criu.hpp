// CRIU, the CPU side of a whole-process checkpoint: found, its version checked, and run.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {

// CRIU's flag that keeps established TCP connections (a job's, docs/job-checkpoint.md), at dump and restore alike.
inline constexpr const char* criu_tcp_established = "--tcp-established";

// Adds --tcp-established to `args` unless there, and how CRIU locks those connections while it works: by default
// it runs iptables-restore, which many machines (containers, GPU nodes) lack; without it on PATH, CRIU's own
// nftables (--network-lock nftables). A --network-lock in `args` is kept. The same at dump and restore.
void add_tcp_established(std::vector<std::string>& args);
inline constexpr int criu_min_major = 4;  // 3.x fails `criu check` on 6.x kernels (its vDSO check)

struct criu_tool {
  std::string path;           // what is run: $VMMCKPT_CRIU, else criu found on PATH
  std::string version;        // as `criu --version` says it, e.g. "4.1.1"
  bool unprivileged = false;  // run with --unprivileged: not root, but CRIU or this tool has the capabilities
};

// Finds CRIU 4.0 or later that can run here: as root, or as another user where CRIU's file capabilities or this
// process's own hold CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE (CRIU's --unprivileged mode). Throws
// criu_unavailable naming what was found and how to provide what is missing, before anything is touched.
criu_tool find_criu();

// Whether capability bits `wanted` are all in what a user who is not root can give CRIU: its file's permitted and
// effective sets (security.capability, as `setcap ...+ep` writes it), or `own_ambient`, the capabilities this
// process passes on to what it runs. Apart for its test.
bool criu_capable(const std::string& criu_path, std::uint64_t own_ambient, std::uint64_t wanted);

// Runs `criu ARGS... --log-file LOG -v2` and waits; its stdout and stderr go to LOG.out. Returns
// CRIU's exit status (or 128 + signal). `started`, when given, is called with CRIU's pid once it runs.
// With `status_file`, CRIU runs under a shell that writes its exit status there when it ends (as a line,
// renamed into place), whether or not this process is still there to learn it: what tells a later command
// that a CRIU left alone by a killed tool succeeded. `started` then gets the shell's pid, which lives as
// long as CRIU does.
// CRIU is watched while it runs: stopped (nothing should stop it), it is continued; when `abandon` returns true
// (polled every 100 ms: what CRIU works on is gone, and a CRIU whose task died may wait for good), it is killed.
int run_criu(const criu_tool& criu, const std::vector<std::string>& args, const std::filesystem::path& log,
             const std::function<void(pid_t)>& started = {}, const std::filesystem::path& status_file = {},
             const std::function<bool()>& abandon = {});

// The lines of a CRIU log worth showing when it failed: its errors, else its last lines.
std::string criu_log_excerpt(const std::filesystem::path& log);
// Whether CRIU's log (or what it printed beside it) has a line with `text`.
bool criu_log_mentions(const std::filesystem::path& log, const std::string& text);

// The processes a CRIU image brings back, from its pstree.img: pids[0] is the root task (CRIU restores it
// with this pid and writes it to --pidfile), the others follow their parents. parents[i] is pids[i]'s.
struct criu_process_tree {
  std::vector<pid_t> pids;
  std::vector<pid_t> parents;
};
// Reads criu_dir/pstree.img (a regular file, never through a symbolic link, its size bounded first);
// image::image_error naming it when it is missing or not a process tree CRIU writes.
criu_process_tree read_criu_pstree(const std::filesystem::path& criu_dir);
// The same from the file's bytes; `where` names it in errors.
criu_process_tree parse_criu_pstree(std::string_view bytes, const std::string& where);

// Whether a CRIU core image (core-PID.img's bytes) records its task stopped by a signal (TASK_STOPPED): CRIU
// restores such a task stopped, and one under the shim could then never load its GPU memory. False for anything
// else, a core image this cannot read included.
bool criu_task_stopped(std::string_view core_bytes);
// Those of `pids` whose core image in criu_dir records them stopped by a signal (a missing or unreadable core
// image is CRIU's restore to refuse).
std::vector<pid_t> criu_stopped_tasks(const std::filesystem::path& criu_dir, const std::vector<pid_t>& pids);

}  // namespace vmmckpt::ckpt
