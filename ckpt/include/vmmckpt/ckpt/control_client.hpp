// The tool's side of the control channel: find a process under the shim and send it typed requests.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "vmmckpt/ckpt/deadlines.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/protocol/protocol.hpp"

namespace vmmckpt::ckpt {

// Descriptors received from the process, closed when this goes.
class received_fds {
 public:
  received_fds() = default;
  explicit received_fds(std::vector<int> fds) : fds_(std::move(fds)) {}
  received_fds(received_fds&& o) noexcept : fds_(std::move(o.fds_)) { o.fds_.clear(); }
  received_fds& operator=(received_fds&& o) noexcept;
  ~received_fds();
  std::size_t size() const { return fds_.size(); }
  int take(std::size_t i);  // the caller owns it from now on

 private:
  std::vector<int> fds_;
};

// How a process that did not answer in time is doing, for the message that says so: "it is
// stopped (SIGSTOP or a debugger)", "it is frozen (cgroup freezer)", or empty.
std::string why_silent(pid_t pid);

class control_client {
 public:
  using clock = std::chrono::steady_clock;

  // Connects to pid's control server by `until` (processes.hpp: control_addresses), checking first
  // that the process exists and is ours (or we are root), and then that the server is that process.
  // Throws tool_error naming the reason: not under vmmckpt (the shim is not loaded in it), or under
  // it but unreachable (each address tried and why); control_error when it does not answer in time.
  explicit control_client(pid_t pid, deadline until = deadline::in(control_deadline));
  // A connection to pid's control server made elsewhere: a job agent's relay to a rank on its node, which checked
  // that process as the constructor above does (docs/job-checkpoint.md, "Across nodes"). The descriptor, a
  // connected stream socket, is this client's from now on; `node` names where pid is, in messages.
  control_client(pid_t pid, int connected_fd, std::string node, deadline until);
  ~control_client();
  control_client(const control_client&) = delete;
  control_client& operator=(const control_client&) = delete;

  pid_t pid() const { return pid_; }
  // Empty for a process of this host; else the node it runs on (its pid means nothing here).
  const std::string& node() const { return node_; }
  // Milliseconds left until the deadline (at least 1, so that a request is never sent already void).
  int remaining_ms() const { return deadline_.remaining_ms(1); }

  // One typed request each, answered by the deadline; control_error when the channel fails or the
  // process refuses. Requests that change the process are stamped valid until the deadline: one
  // that waits in the socket past it (the program stopped meanwhile) is refused, never acted on late.
  // With prepare_hold, the program lists its allocations for the dump_begin that follows.
  control::hello_reply hello(bool prepare_hold = false);
  // Holds the program for at most hold_ms; its pool memory arrives as one descriptor per segment.
  // for_suspend: the program says "suspending" rather than "dumping" to ps meanwhile.
  // job: a suspend of one rank of a whole job (control::job_suspend, docs/job-checkpoint.md).
  control::dump_begin_reply dump_begin(std::chrono::milliseconds hold_deadline, received_fds& fds,
                                       bool for_suspend = false,
                                       const std::optional<control::job_suspend>& job = std::nullopt);
  control::dump_end_reply dump_end();
  control::suspend_reply suspend(const std::string& image, const std::string& image_id);
  // With `progress`, the process is asked for progress frames as it loads (an older one sends none).
  using progress_handler = std::function<void(const control::progress_frame&)>;
  // image: load from there instead of where suspend wrote it (control::resume_request::image).
  // stage and ranks: a job's resume in its two stages (control::resume_request).
  control::resume_reply resume(const progress_handler& progress = {}, const std::string& image = {},
                               control::resume_request::stage stage = control::resume_request::stage::both,
                               const std::vector<std::int64_t>& ranks = {});
  control::check_reply check();
  // The CPU's window (docs/peek.md): the reply, its descriptors in `fds` (copy: the bytes; map: one per piece).
  control::peek_reply peek(control::peek_request request, received_fds& fds);
  // Writes the bytes in `bytes_fd`, a sealed memfd (not closed here).
  control::poke_reply poke(control::poke_request request, int bytes_fd);
  // Every allocation (from the allocation table) and the program's named ranges.
  control::regions_reply regions();

  // The cut of a job (docs/job-checkpoint.md). cut_arm arms the process until this connection closes or
  // armed_for passes, and answers its state; from then on the process sends a cut_status frame whenever its
  // state changes, which next_cut_status reads (nothing when none came within wait_ms). cut_targets only sends:
  // its answer is the next status.
  control::cut_status cut_arm(std::chrono::milliseconds armed_for);
  void cut_targets(const std::vector<control::comm_count>& targets, bool freeze = false);
  std::optional<control::cut_status> next_cut_status(int wait_ms);
  int fd() const { return fd_; }

  // Called about ten times a second while an answer is awaited, until it is given another (empty: none):
  // it throws to give up waiting (Ctrl-C while the program drains for a hold).
  void while_waiting(std::function<void()> check) { while_waiting_ = std::move(check); }
  // From `after` on, an answer is not awaited from a process of this host that is stopped (SIGSTOP, a debugger,
  // a frozen cgroup: why_silent): the request fails within a tenth of a second, saying so, however long the
  // deadline. dump_begin sets it to the hold's deadline, past which the tool waits only for a running program's
  // own account of why it could not be held.
  void give_up_on_stopped_after(clock::time_point after) { patience_ = after; }

 private:
  void send(const control::request& r, const std::vector<int>& fds = {});
  std::string receive(std::vector<int>* fds, int timeout_ms);
  template <typename Reply>
  Reply call(const control::request& r, std::vector<int>* fds = nullptr, const progress_handler& progress = {},
             const std::vector<int>& send_fds = {});
  [[noreturn]] void channel_failed(const protocol::failure& f) const;

  pid_t pid_;
  std::string node_;
  deadline deadline_;
  clock::time_point start_ = clock::now();
  int fd_ = -1;
  std::function<void()> while_waiting_;
  clock::time_point patience_ = clock::time_point::max();
};

}  // namespace vmmckpt::ckpt
