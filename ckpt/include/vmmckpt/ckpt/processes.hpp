// Finding the processes under the shim, whatever their environment, and what `cuda-ckpt ps` says of each.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::ckpt {

// The shim's file name as /proc/PID/maps shows it: `cuda-ckpt run` preloads it under this name.
inline constexpr std::string_view shim_file_name = "libvmmckpt.so";

// A process of that pid exists (ours or not; a zombie too).
bool process_exists(pid_t pid);
// A process of that pid runs (exists and is no zombie).
bool process_alive(pid_t pid);
// Whether the writer of an image being written under its staging name (image/staging_name.hpp) still runs: the
// pid in its name, a process of that pid that started after the directory was made being another one (the pid
// was reused).
bool staging_writer_alive(const std::filesystem::path& staging);

// Refuses (tool_error "... belongs to another user") a process this user may not checkpoint: another user's,
// unless we are root. Checked first, so that a refusal says why rather than that no process of ours was found.
void require_own_process(pid_t pid);

// Whether the shim is mapped in a process: unknown when its maps cannot be read (another user's
// process and we are not root, or it is gone).
enum class shim_presence { loaded, absent, unknown };
shim_presence shim_in(pid_t pid);

// Whether a file whose name starts with `prefix` (e.g. "libcuda.so") is mapped in pid (false when its
// maps cannot be read).
bool maps_file(pid_t pid, std::string_view prefix);

// The process is stopped by a signal (SIGSTOP, or CRIU's --leave-stopped): state T in /proc/PID/stat.
bool process_stopped(pid_t pid);
// Those of `pids` that are stopped so.
std::vector<pid_t> stopped_among(const std::vector<pid_t>& pids);
// Why an operation refuses a process stopped by a signal, one wording for dump, suspend, resume and the whole-process
// dump: it would wait for the process's answer for good. `again`: what to do once it is continued ("dump again").
std::string stopped_refusal(pid_t pid, std::string_view again);

// pid's parent (0 when it cannot be read), and the tree under root: root first, then every descendant
// after its parent.
pid_t parent_of(pid_t pid);
std::vector<pid_t> process_tree(pid_t root);

// Its name in /proc/PID/comm ("" when gone).
std::string short_name_of(pid_t pid);

// Where pid's control server may listen, in the order to try: its socket file in the runtime directory
// its own environment names (XDG_RUNTIME_DIR, else /tmp/vmmckpt-UID), then in ours, then in its private
// directories (/tmp/vmmckpt-UID.*, owned by its uid, closed to others), then its abstract names
// (protocol::abstract_addresses; last: anyone may bind one first and never answer). Duplicates left out.
std::vector<std::string> control_addresses(pid_t pid);

// uid's private socket directories under `tmp` (protocol::make_private_dir): "vmmckpt-UID.*", each a
// directory (not a link) owned by uid with no access for others, so that nobody else can have put it there.
std::vector<std::string> private_socket_dirs(const std::string& tmp, uid_t uid);

// The value of `name` in the environment the process started with; nullopt when unset or unreadable.
std::optional<std::string> environment_value(pid_t pid, std::string_view name);

// The process's pid in its own pid namespace (the last of NSpid in /proc/PID/status): what its shim names its
// socket by, and the pid CRIU's image records. `pid` itself where the kernel does not say.
pid_t pid_in_own_namespace(pid_t pid);

// Whether pid sees the directory `dir` (or, when that does not exist yet, its nearest existing ancestor) as the
// same directory we do. False only when it runs in a mount namespace of its own (a container) where that path is
// another directory or none; true when that cannot be told (another user's process).
bool sees_directory(pid_t pid, const std::filesystem::path& dir);

// The process's command line from /proc (empty when it cannot be read).
std::vector<std::string> command_line_of(pid_t pid);

// One process of `cuda-ckpt ps`.
struct process_entry {
  pid_t pid = 0;
  uid_t uid = 0;
  // running, dumping, suspending, suspended, resuming, paused (what it said), or, when it did not answer:
  // "not responding" (it took no connection or sent no answer in time), "no control server" (the shim
  // is loaded but has no server: no CUDA call yet, or a fork() child) or "unreachable".
  std::string status;
  std::optional<control::hello_reply> hello;  // when it answered
  std::string problem;                        // why it did not answer
  std::vector<std::string> command;           // its hello's, else from /proc
};

// The ps state of a process that answered: what it is busy with, else suspended or running.
std::string status_of(const control::hello_reply& hello);
// Whether a process that answered waits for a resume: suspended, and not loading its memory already (its hello
// says suspended until the load is done; a resume asked for then is refused once it runs).
bool waits_for_resume(const control::hello_reply& hello);

// Every process under the shim this user may see (root: everyone's), found by the shim in
// /proc/*/maps, by the abstract names in /proc/net/unix and by the sockets in our runtime directory, asked all at once and each given `wait`
// to answer; ascending by pid. With `only`, that process alone: a tool_error says why when it is
// not under vmmckpt.
std::vector<process_entry> list_processes(pid_t only = 0,
                                          std::chrono::milliseconds wait = std::chrono::milliseconds(1000));

// Where list_processes looks, in words, for a message when it found nothing.
std::string where_processes_are_looked_for();

}  // namespace vmmckpt::ckpt
