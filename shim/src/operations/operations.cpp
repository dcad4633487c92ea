// In-process operations: the lock they share, the state they leave the process in, and the sequence of each
// request cuda-ckpt (or another process under the shim) makes: a hold and what ends it (dump_end, suspend,
// the deadline, the client's going), a resume, the IPC and VMM sharing requests, hello and check.
#include "operations/operations.hpp"

#include <algorithm>
#include <atomic>
#include <string>

#include <sys/stat.h>

#include "memory/ipc_exports.hpp"
#include "memory/ipc_imports.hpp"
#include "memory/vmm_sharing.hpp"
#include "operations/job_cut.hpp"
#include "operations/peek.hpp"
#include "operations/process_control.hpp"
#include "operations/restore.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/support/log.hpp"

namespace vmmckpt::detail {
namespace {

using clock = std::chrono::steady_clock;

constexpr auto max_hold_deadline = std::chrono::hours(1);  // the longest hold a tool may ask for
// An IPC open waits for a dump in progress to end; the importer waits a little longer (ipc_imports.cpp).
constexpr auto ipc_open_wait = std::chrono::seconds(50);
// Resume's progress frames are best effort: each gets this long to leave.
constexpr auto progress_send_wait = std::chrono::milliseconds(200);
// How often a cut's connection looks for a change of the cut's state to send: the cut's latency per step.
constexpr auto cut_poll = std::chrono::milliseconds(1);

std::atomic<process_state> g_state{process_state::running};
// What the request that holds operation_lock() is doing, for hello to report without waiting for it.
std::atomic<control::activity> g_activity{control::activity::idle};

// Sets g_activity for a scope: the operation's, under operation_lock().
struct activity_scope {
  explicit activity_scope(control::activity a) { g_activity.store(a); }
  void change(control::activity a) { g_activity.store(a); }
  ~activity_scope() { g_activity.store(control::activity::idle); }
  activity_scope(const activity_scope&) = delete;
  activity_scope& operator=(const activity_scope&) = delete;
};

// Sends the hold's reply and the exported handles, in as many frames as the descriptors need.
bool send_held(client_channel& client, const control::dump_begin_reply& reply, const std::vector<int>& fds) {
  const std::size_t first = std::min<std::size_t>(fds.size(), protocol::max_fds_per_message);
  bool sent = client.send(control::encode(reply), {fds.begin(), fds.begin() + static_cast<long>(first)});
  for (std::size_t i = first; sent && i < fds.size(); i += protocol::max_fds_per_message) {
    const std::size_t n = std::min<std::size_t>(fds.size() - i, protocol::max_fds_per_message);
    sent = client.send(control::encode(control::fds_frame{static_cast<std::uint32_t>(n)}),
                       {fds.begin() + static_cast<long>(i), fds.begin() + static_cast<long>(i + n)});
  }
  return sent;
}

// "12, 34": the processes a refusal names.
std::string pid_list(const std::vector<pid_t>& pids) {
  std::string text;
  for (pid_t p : pids) text += (text.empty() ? "" : ", ") + std::to_string(p);
  return text;
}

// An IPC open or a VMM share that waited ipc_open_wait for another operation to end.
bool refuse_busy(client_channel& client) {
  return refuse(client, control::refusal::busy, "another operation (a dump, suspend or resume) kept the program busy");
}

// A suspend's hold is refused while other processes map the program's memory: their mappings would keep the
// memory the suspend gives back, and they would not see what resume loads (docs/ipc.md). In a job's suspend, the
// job's own ranks may: they give their mappings back with it (docs/job-checkpoint.md). Checked under the
// operation lock, which an IPC open takes too. An empty string when nothing refuses it.
std::string importers_refusal(const control::dump_begin_request& request) {
  if (const auto importers = live_importers(); !importers.empty())
    return "other processes map this program's GPU memory through CUDA IPC (pid " + pid_list(importers) +
           "); a suspend would take it from under them. Suspend or stop them first, or have them close their "
           "handles (cudaIpcCloseMemHandle)";
  auto importers = vmm_importers();
  if (request.job)
    std::erase_if(importers, [&](pid_t p) {
      return std::find(request.job->ranks.begin(), request.job->ranks.end(), p) != request.job->ranks.end();
    });
  if (!importers.empty())
    return "other processes map this program's VMM memory, imported from POSIX FDs it exported (pid " +
           pid_list(importers) + (request.job ? ", not ranks of the job" : "") +
           "; NCCL's P2P and SHM transports do this between the ranks of a job); a suspend would take it from under "
           "them. " +
           (request.job ? "Name them with the job's ranks" : "Suspend the whole job (suspend --job), or dump it");
  if (request.job && !current_imports().empty())
    return "this program maps other processes' memory through CUDA IPC (NCCL with NCCL_CUMEM_ENABLE=0): a job's "
           "suspend gives back only memory mapped with the VMM API (NCCL's default)";
  return {};
}

bool job_accepted(const control::job_suspend& job) {
  struct stat st {};
  return ::lstat((job.dir + "/" + suspend_claim::job_accepted).c_str(), &st) == 0;
}

// The end of a hold that was not a suspend. A hold for a job's suspend is settled by the job's claim first: this
// rank cancels it (nothing was decided, and nobody will suspend), or finds it accepted, and then suspends itself
// as every other rank is (the image its tool committed is complete: the claim is accepted only then).
void let_go(const control::dump_begin_request& request, const char* why) noexcept {
  try {
    if (!request.job || suspend_claim::take_job(request.job->dir, suspend_claim::job_cancelled) ||
        !job_accepted(*request.job)) {
      release(why);
      return;
    }
    log::info("control: the job's suspend was decided while this rank's tool was gone ({}); it suspends itself", why);
    const auto outcome = suspend_held(
        control::suspend_request{request.job->image, request.job->image_id, control::unix_ms_now() + 60'000}, true);
    if (const auto* refused = std::get_if<control::failure_reply>(&outcome))
      log::error("control: this rank of a suspended job could not suspend itself: {}", refused->error);
  } catch (...) {
    // Out of memory before anything was decided here: released, as a hold whose client went away is.
    if (current_state() != process_state::suspended) release(why);
  }
}

// Why a hold is refused before the program is held; empty when it is not.
std::string hold_refusal(const control::dump_begin_request& request) {
  if (request.for_suspend)
    if (std::string why = importers_refusal(request); !why.empty()) return why;
  // A job's rank cannot refuse its suspend once the job's claim is accepted: what its resume needs is set aside
  // now, while it still can.
  if (request.job) return reserve_resume_room();
  return {};
}

// From when the program is held: however the hold ends (an exception included), it is released, or
// suspended on purpose.
struct held_guard {
  const control::dump_begin_request& request;
  bool settled = false;
  ~held_guard() {
    if (!settled && current_state() != process_state::suspended) let_go(request, "a request failed unexpectedly");
  }
};

// A hold ended by suspend.
void suspend_at_end(client_channel& client, const control::dump_begin_request& request,
                    const control::suspend_request& s, activity_scope& busy) {
  if (request.job && !job_accepted(*request.job)) {
    // The job's claim decides for every rank, and it is not accepted: nobody is suspended.
    let_go(request, "the job's suspend was not accepted");
    client.send(control::encode(control::failure_reply{
        control::refusal::withdrawn, "the job's suspend was not accepted: the program goes on, not suspended"}));
    return;
  }
  // Accepted, the gate stays closed: threads that call CUDA wait until resume. (suspend_held
  // releases the program itself when it does not suspend it.)
  const auto outcome = suspend_held(s, request.job.has_value());
  // Idle before the reply: a client that goes on at the reply (ps) must not find the operation still under way.
  busy.change(control::activity::idle);
  std::visit([&](const auto& reply) { client.send(control::encode(reply)); }, outcome);
}

// A hold ended by dump_end.
void release_at_end(client_channel& client, const control::dump_begin_request& request, activity_scope& busy) {
  if (request.job) {
    let_go(request, "dump finished");
    client.send(control::encode(control::dump_end_reply{0}));
    return;
  }
  const control::dump_end_reply released{release("dump finished")};
  busy.change(control::activity::idle);
  client.send(control::encode(released));
}

// Held until the client is done copying out of the GPU: its next request (dump_end or suspend) ends the hold,
// as its going or the deadline do.
void end_hold(client_channel& client, const control::dump_begin_request& request, clock::time_point deadline_at,
              activity_scope& busy, held_guard& guard) {
  std::string payload;
  std::vector<int> ignored;
  protocol::failure error;
  const auto left = std::max(std::chrono::milliseconds(0),
                             std::chrono::duration_cast<std::chrono::milliseconds>(deadline_at - clock::now()));
  const bool received = client.receive(payload, ignored, left, error);
  protocol::close_all(ignored);
  if (!received) {
    guard.settled = true;
    let_go(request, error.kind == protocol::failure_kind::timed_out ? "deadline passed" : "client went away");
    return;
  }
  const auto decoded = control::decode_request(payload);
  const auto* next = std::get_if<control::request>(&decoded);
  if (const auto* s = next != nullptr ? std::get_if<control::suspend_request>(next) : nullptr) {
    busy.change(control::activity::suspending);
    guard.settled = true;
    suspend_at_end(client, request, *s, busy);
    return;
  }
  guard.settled = true;
  if (next != nullptr && std::holds_alternative<control::dump_end_request>(*next)) {
    release_at_end(client, request, busy);
    return;
  }
  let_go(request, "the client sent something else than dump_end or suspend");
  refuse(client, control::refusal::bad_request, "expected dump_end or suspend");
}

// dump_begin: the program is held until the client says dump_end (or suspend), goes away, or the
// deadline passes; the gate is open again in every case but suspend.
void serve_hold(client_channel& client, const control::dump_begin_request& request) {
  if (request.hold_deadline <= std::chrono::milliseconds(0) || request.hold_deadline > max_hold_deadline) {
    refuse(client, control::refusal::bad_request,
           "hold_deadline_ms " + std::to_string(request.hold_deadline.count()) + " is out of range (1 to " +
               std::to_string(std::chrono::milliseconds(max_hold_deadline).count()) + ")");
    return;
  }
  std::unique_lock operation(operation_lock(), std::defer_lock);
  if (!take_operation(client, operation, request.valid_until_ms)) return;
  if (const std::string why = hold_refusal(request); !why.empty()) {
    refuse(client, control::refusal::failed, why);
    return;
  }
  activity_scope busy(request.for_suspend ? control::activity::suspending : control::activity::dumping);
  // The hold lasts hold_deadline from now, whatever time the request spent waiting.
  const auto hold_deadline_at = clock::now() + request.hold_deadline;
  std::vector<int> fds;
  auto held = hold(hold_deadline_at, fds);
  if (auto* reply = std::get_if<control::dump_begin_reply>(&held)) reply->hold_deadline = request.hold_deadline;
  if (auto* refused = std::get_if<control::failure_reply>(&held)) {
    protocol::close_all(fds);
    client.send(control::encode(*refused));
    return;
  }
  held_guard guard{request};
  const bool sent = send_held(client, std::get<control::dump_begin_reply>(held), fds);
  protocol::close_all(fds);  // the client has its own copies now
  fault_point("program:held");
  if (!sent) {
    guard.settled = true;
    let_go(request, "client gone before the handles were sent");
    return;
  }
  end_hold(client, request, hold_deadline_at, busy, guard);
}

// cut_arm: the process is armed until the client releases it, goes away, or the deadline passes
// (docs/job-checkpoint.md); meanwhile the client gets a cut_status frame whenever the cut's state changes, and
// may aim it with cut_targets.
void serve_cut(client_channel& client, const control::cut_arm_request& request) {
  if (request.hold_deadline <= std::chrono::milliseconds(0) || request.hold_deadline > max_hold_deadline) {
    refuse(client, control::refusal::bad_request,
           "hold_deadline_ms " + std::to_string(request.hold_deadline.count()) + " is out of range");
    return;
  }
  if (control::unix_ms_now() > request.valid_until_ms) {
    refuse(client, control::refusal::expired, "the request arrived after it expired; nothing was done");
    return;
  }
  if (const process_state now = current_state(); now != process_state::running && now != process_state::holding) {
    refuse(client, control::refusal::suspended, "the program's GPU memory is given back (suspended or paused)");
    return;
  }
  const auto deadline = clock::now() + request.hold_deadline;
  const std::uint64_t session = job_cut::arm(deadline);
  if (session == 0) {
    refuse(client, control::refusal::busy, "another cuda-ckpt holds this process in a job's cut");
    return;
  }
  struct disarm_at_end {
    std::uint64_t session;
    ~disarm_at_end() { job_cut::disarm(session); }
  } disarm{session};
  std::uint64_t seen = job_cut::generation();
  if (!client.send(control::encode(job_cut::status()))) return;
  while (clock::now() < deadline) {
    if (client.readable(cut_poll)) {
      std::string payload;
      std::vector<int> fds;
      protocol::failure error;
      const bool got = client.receive(payload, fds, std::chrono::seconds(1), error);
      protocol::close_all(fds);
      if (!got) return;  // the client went away: disarmed
      const auto decoded = control::decode_request(payload);
      const auto* next = std::get_if<control::request>(&decoded);
      if (const auto* t = next ? std::get_if<control::cut_targets_request>(next) : nullptr) {
        job_cut::set_targets(t->targets, t->freeze);
      } else if (next != nullptr && std::holds_alternative<control::cut_release_request>(*next)) {
        job_cut::disarm(session);
        client.send(control::encode(job_cut::status()));
        return;
      } else {
        refuse(client, control::refusal::bad_request, "expected cut_targets or cut_release");
        return;
      }
      seen = job_cut::generation();
      if (!client.send(control::encode(job_cut::status()))) return;
    } else if (const std::uint64_t now = job_cut::generation(); now != seen) {
      seen = now;
      if (!client.send(control::encode(job_cut::status()))) return;
    }
  }
}

void serve_resume(client_channel& client, const control::resume_request& request) {
  std::unique_lock operation(operation_lock(), std::defer_lock);
  if (!take_operation(client, operation, request.valid_until_ms)) return;
  activity_scope busy(control::activity::resuming);
  // Progress frames are best effort (upload() reports at most ten a second): each is given a short
  // while to leave, and none follows one that could not (a tool that stopped reading must not slow
  // the load).
  bool sending = true;
  restore::upload_progress progress;
  if (request.progress)
    progress = [&](std::uint64_t done, std::uint64_t total) {
      if (!sending) return;
      sending = client.send_within(control::encode(control::progress_frame{done, total}), progress_send_wait);
    };
  std::visit([&](const auto& reply) { client.send(control::encode(reply)); }, resume(request, progress));
}

// ipc_open: the physical memory under an exported allocation, to the process that opens its handle.
void serve_ipc_open(client_channel& client, const control::ipc_open_request& request) {
  const pid_t importer = client.peer_pid();
  if (importer == 0) {
    refuse(client, control::refusal::failed, "cannot tell which process asks");
    return;
  }
  // Not while a dump holds the program or a suspend gives its memory back.
  std::unique_lock operation(operation_lock(), std::defer_lock);
  if (!operation.try_lock_for(ipc_open_wait)) {
    refuse_busy(client);
    return;
  }
  if (const process_state now = current_state(); now == process_state::suspended || now == process_state::paused) {
    refuse(client, control::refusal::suspended, "the program's GPU memory is given back (suspended or paused)");
    return;
  }
  std::vector<int> fds;
  const auto outcome = open_export(request, importer, fds);
  std::visit([&](const auto& reply) { client.send(control::encode(reply), fds); }, outcome);
  protocol::close_all(fds);
}

// vmm_identify: which handle of this process the FD the request carried is (vmm_sharing.hpp).
bool serve_vmm_identify(client_channel& client, const std::vector<int>& fds) {
  if (fds.size() != 1)
    return refuse(client, control::refusal::bad_request, "vmm_identify carries one descriptor, the FD imported");
  return std::visit([&](const auto& reply) { return client.send(control::encode(reply)); },
                    identify_export(fds[0], client.peer_pid()));
}

// vmm_share: a new FD of a handle, for a restored importer. Not while a suspend gives the memory back.
bool serve_vmm_share(client_channel& client, const control::vmm_share_request& request) {
  std::unique_lock operation(operation_lock(), std::defer_lock);
  // A job's ranks resuming ask each other while each holds its own lock (docs/job-checkpoint.md); memory loaded
  // while suspended is given back by nothing until the process runs again.
  if (!memory_loaded_while_suspended() && !operation.try_lock_for(ipc_open_wait)) return refuse_busy(client);
  std::vector<int> fds;
  const auto outcome = share_handle(request.token, client.peer_pid(), fds);
  const bool sent = std::visit([&](const auto& reply) { return client.send(control::encode(reply), fds); }, outcome);
  protocol::close_all(fds);
  return sent;
}

}  // namespace

bool refuse(client_channel& client, control::refusal code, const std::string& why) {
  return client.send(control::encode(control::failure_reply{code, why}));
}

bool take_operation(client_channel& client, std::unique_lock<std::timed_mutex>& lock, std::int64_t valid_until_ms) {
  const std::int64_t left_ms = valid_until_ms - control::unix_ms_now();
  if (left_ms > 0 && lock.try_lock_for(std::chrono::milliseconds(left_ms))) return true;
  refuse(client, left_ms > 0 ? control::refusal::busy : control::refusal::expired,
         left_ms > 0
             ? "another operation (a dump, suspend or resume) kept the program busy until the request's deadline"
             : "the request arrived after it expired; nothing was done");
  return false;
}

bool answer(client_channel& client, const control::request& request, const std::vector<int>& fds) {
  return std::visit(
      [&](const auto& r) -> bool {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, control::hello_request>) {
          control::hello_reply reply = describe_process();
          reply.activity = g_activity.load();
          if (!client.send(control::encode(reply))) return false;
          // After the answer: the tool prepares its side meanwhile.
          if (r.prepare_hold && current_state() == process_state::running) prepare_hold();
          return true;
        } else if constexpr (std::is_same_v<T, control::check_request>) {
          return client.send(control::encode(check_pools()));
        } else if constexpr (std::is_same_v<T, control::dump_begin_request>) {
          serve_hold(client, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::resume_request>) {
          serve_resume(client, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::ipc_open_request>) {
          serve_ipc_open(client, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::ipc_close_request>) {
          if (const pid_t importer = client.peer_pid(); importer != 0) close_export(r, importer);
          return client.send(control::encode(control::ipc_close_reply{}));
        } else if constexpr (std::is_same_v<T, control::vmm_identify_request>) {
          return serve_vmm_identify(client, fds);
        } else if constexpr (std::is_same_v<T, control::vmm_share_request>) {
          return serve_vmm_share(client, r);
        } else if constexpr (std::is_same_v<T, control::vmm_unshare_request>) {
          unshare_handle(r.token, client.peer_pid());
          return client.send(control::encode(control::vmm_unshare_reply{}));
        } else if constexpr (std::is_same_v<T, control::cut_arm_request>) {
          serve_cut(client, r);
          return false;  // the connection served the cut: it ends with it
        } else if constexpr (std::is_same_v<T, control::peek_request>) {
          serve_peek(client, r);
          return true;
        } else if constexpr (std::is_same_v<T, control::poke_request>) {
          serve_poke(client, r, fds);
          return true;
        } else if constexpr (std::is_same_v<T, control::regions_request>) {
          serve_regions(client);
          return true;
        } else if constexpr (std::is_same_v<T, control::cut_targets_request> ||
                             std::is_same_v<T, control::cut_release_request>) {
          return refuse(client, control::refusal::bad_request, "no cut armed on this connection (cut_arm first)");
        } else {
          // dump_end or suspend with no hold in progress.
          static_assert(std::is_same_v<T, control::dump_end_request> || std::is_same_v<T, control::suspend_request>);
          return refuse(client, control::refusal::not_held,
                        "no dump in progress: the program was already released (the hold deadline passed)");
        }
      },
      request);
}

process_state current_state() noexcept { return g_state.load(std::memory_order_acquire); }

void enter_state(process_state next) noexcept { g_state.store(next, std::memory_order_release); }

const char* name_of(process_state s) noexcept {
  switch (s) {
    case process_state::running: return "running";
    case process_state::holding: return "holding";
    case process_state::suspended: return "suspended";
    case process_state::paused: return "paused";
    case process_state::restoring: return "restoring";
  }
  return "unknown";
}

std::timed_mutex& operation_lock() {
  static std::timed_mutex* lock = new std::timed_mutex;  // never destroyed: threads may call at exit
  return *lock;
}

}  // namespace vmmckpt::detail
