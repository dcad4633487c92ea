// The control channel between a process under the shim and cuda-ckpt: paths, framing, fd passing, peer checks.
// docs/protocol.md describes the messages. Nothing here throws: the shim uses it too.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vmmckpt::protocol {

inline constexpr std::uint32_t version = 5;  // 2: dump_begin sends the allocation table as a descriptor; 3: VMM memory;
                                             // 4: the hold's deadline is hold_deadline_ms in request and reply
                                             // 5: peek, poke and regions (docs/peek.md)
inline constexpr std::uint32_t max_payload = 64u << 20;  // a bigger frame is refused
inline constexpr int max_fds_per_message = 250;          // SCM_RIGHTS limit is 253

// Wire constants of the frame header: five little-endian u32 {magic, version,
// payload length, fd count, reserved (sent as 0, ignored on receipt)}.
inline constexpr std::uint32_t frame_magic = 0x4b434d56;  // "VMCK" in memory order
inline constexpr std::size_t frame_header_size = 20;

// What went wrong on the channel, for callers to act on without reading the text.
enum class failure_kind : std::uint8_t {
  none,
  timed_out,           // the deadline passed
  connection_closed,   // the peer went away (at a frame boundary or mid-frame)
  bad_frame,           // not a frame of ours: magic, version, lengths, descriptors
  too_large,           // refused before sending: too many descriptors or too long a payload
  no_socket,           // connect: nothing at that path
  connection_refused,  // connect: a stale socket, its process is gone
  permission_denied,   // connect: another user's socket or directory
  out_of_memory,
  system,  // any other failing system call; the text names it
};

// A failure's kind and a message naming it (paths, counts, errno text).
struct failure {
  failure_kind kind = failure_kind::none;
  std::string text;
};

// $XDG_RUNTIME_DIR/vmmckpt when XDG_RUNTIME_DIR is set and non-empty, else
// /tmp/vmmckpt-<euid>. Empty only when memory ran out.
std::string runtime_dir() noexcept;
std::string socket_path(pid_t pid) noexcept;  // runtime_dir() + "/<pid>.sock"

// The abstract socket name of pid's control server: "\0vmmckpt/<pid>" (shown as @vmmckpt/<pid>). It
// names the process whatever its environment (XDG_RUNTIME_DIR under sudo, ssh, systemd or Slurm) and
// vanishes with it, so it is never stale. Anyone may connect to an abstract name: the server's peer
// check is what refuses others, and a client checks with peer_credentials that the server is the
// process it asked for (someone else could have bound the name first). listen_at and connect_to
// take it like a path. Empty only when memory ran out.
std::string abstract_address(pid_t pid) noexcept;
// The name a server takes when abstract_address(pid) is held by someone else: "\0vmmckpt/<pid>.<16 hex
// digits>", the digits random (getrandom), so that nobody can bind it ahead of the program.
std::string abstract_alternate(pid_t pid, std::uint64_t random) noexcept;
// Where pid's server may listen under an abstract name: abstract_address(pid), then every alternate bound in
// pid's network namespace (/proc/PID/net/unix), in the order listed. Any of them may be held by someone else:
// the caller checks the server's credentials before it sends anything. Empty only when memory ran out.
std::vector<std::string> abstract_addresses(pid_t pid) noexcept;
// Listens at abstract_address(pid), or, when someone else holds that name, at a fresh abstract_alternate
// (a few tries). `name` is set to the name taken. -1 with error on failure.
int listen_abstract_for(pid_t pid, std::string& name, failure& error) noexcept;
bool is_abstract(const std::string& address) noexcept;
// A socket address as people read it: "@name" for an abstract one, else the path.
std::string printable_address(const std::string& address) noexcept;

// Creates runtime_dir() with mode 0700 if needed and checks it is a directory
// owned by us with no access for others (refuses it otherwise: a directory
// others can write could hold a planted socket). A directory of ours that is
// too open is tightened to 0700; a symlink or someone else's directory is refused.
bool ensure_runtime_dir(failure& error) noexcept;
// Where a server's socket file goes when runtime_dir() cannot be used (someone else made
// /tmp/vmmckpt-<euid> first, or it is a symlink): a fresh directory private_dir_prefix() + "XXXXXX"
// (mkdtemp: mode 0700, a name nobody can make first). Its path, or empty with error.
std::string make_private_dir(failure& error) noexcept;
// "/tmp/vmmckpt-<uid>.": the start of the names of such directories of uid's. Empty only when memory ran out.
std::string private_dir_prefix(uid_t uid) noexcept;

// A listening socket at path, mode 0600 (an old socket file there is replaced;
// anything else there is refused), or at an abstract address (taken: system, "address in use").
// Close-on-exec. -1 with error on failure.
int listen_at(const std::string& path, failure& error) noexcept;
// Connects to path; -1 with error on failure: no_socket (nothing there; for an abstract address:
// nobody listens under that name), connection_refused (a stale socket: its process is gone),
// permission_denied, or system.
int connect_to(const std::string& path, failure& error) noexcept;
// The same within timeout_ms (< 0: forever); timed_out when the process takes no connection by then.
// The socket returned is non-blocking (send_frame and recv_frame wait with poll).
int connect_to(const std::string& path, int timeout_ms, failure& error) noexcept;

// The peer's credentials; allowed when it is the same user or root.
// False (uid -1, pid -1) when they cannot be read.
bool peer_allowed(int fd, uid_t& peer_uid, pid_t& peer_pid) noexcept;
// The peer's credentials as the kernel recorded them (a server's: when it called listen), in our pid
// namespace. False when they cannot be read.
bool peer_credentials(int fd, uid_t& peer_uid, pid_t& peer_pid) noexcept;

// One frame: header (magic, version, payload length, fd count), JSON payload,
// and up to max_fds_per_message descriptors riding along (SCM_RIGHTS).
// timeout_ms < 0 waits forever. On failure `error` says why (connection_closed when the peer
// went away, timed_out when the deadline passed). After any failure the stream may be
// mid-frame: close it.
// send_frame never closes the caller's fds; recv_frame replaces `fds` with the
// received descriptors (close-on-exec, the caller owns them) and on failure
// leaves no descriptor open and `fds` empty.
bool send_frame(int fd, const std::string& payload, const std::vector<int>& fds, failure& error) noexcept;
// Closes every descriptor of a frame's and empties the list.
void close_all(std::vector<int>& fds) noexcept;
bool recv_frame(int fd, std::string& payload, std::vector<int>& fds, int timeout_ms, failure& error) noexcept;
// send_frame with a deadline over the whole frame: a peer that stops reading
// cannot hold the sender forever.
bool send_frame(int fd, const std::string& payload, const std::vector<int>& fds, int timeout_ms,
                failure& error) noexcept;

}  // namespace vmmckpt::protocol
