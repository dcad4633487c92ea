// The cut of a multi-rank job: NCCL operations counted per communicator, and the wait at an NCCL call.
//
// One mutex guards everything here. An NCCL call already costs microseconds; taking an uncontended mutex twice
// adds tens of nanoseconds, and keeps the argument simple: a thread that passed its cut point is counted in
// in_flight under the same lock that the cut's check reads, so "every count at its target and nothing in flight"
// is a state no thread can leave without the tool seeing it.
#include "operations/job_cut.hpp"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace vmmckpt::detail::job_cut {
namespace {

using clock = std::chrono::steady_clock;

struct record {
  std::uint64_t id = 0;
  int rank = 0, size = 0;
  std::uint64_t ops = 0;
  std::map<int, std::uint64_t> sends, recvs;
  std::uint64_t splits = 0;  // splits made of it so far: the next one's identity
  bool bound = true;         // false while its creation has not returned (a split's rank is not known yet)
};

struct cut_state {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::unique_ptr<record>> records;  // every communicator this process made, in order
  std::unordered_map<void*, record*> by_handle;
  bool armed = false;
  std::uint64_t session = 0;  // which arming: a connection that went away disarms only its own
  bool freeze = false;        // making a communicator waits too (every rank is at the cut)
  bool suspended = false;     // a job's rank suspended: its NCCL calls wait until it runs again
  clock::time_point deadline;
  std::map<std::pair<std::uint64_t, int>, control::comm_count> targets;  // by (id, rank)
  int waiting = 0, in_flight = 0;
  const char* where = nullptr;
};

// Never destroyed: threads may call NCCL while the process exits.
cut_state& state() {
  static cut_state* s = new cut_state;
  return *s;
}
// armed or suspended: read without the lock by every NCCL call, so that a process never armed pays nothing more.
std::atomic<bool> g_active{false};
std::atomic<std::uint64_t> g_generation{0};

// Under the state's lock: the tool's connection sees the generation move; threads waiting at the cut re-check.
void changed(cut_state& s) {
  g_generation.fetch_add(1, std::memory_order_release);
  if (s.waiting > 0) s.changed.notify_all();
}

// A group of NCCL calls on this thread: its depth, whether its start was counted in flight, and its operations.
struct pending_operation {
  void* comm;
  operation::kind what;
  int peer;
};
struct thread_group {
  int depth = 0;
  bool in_flight = false;
  std::vector<pending_operation> operations;
};
thread_local thread_group t_group;

std::uint64_t fnv1a(const void* bytes, std::size_t n, std::uint64_t h = 14695981039346656037ULL) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

// A communicator the shim did not see made (its creation passed another door): known to this process alone.
record* record_for(cut_state& s, void* comm) {
  if (const auto it = s.by_handle.find(comm); it != s.by_handle.end()) return it->second;
  auto r = std::make_unique<record>();
  r->id = id_of_local(comm);
  record* raw = r.get();
  s.records.push_back(std::move(r));
  s.by_handle[comm] = raw;
  return raw;
}

void count(record& r, operation::kind what, int peer) {
  if (what == operation::kind::collective)
    ++r.ops;
  else if (peer >= 0 && (r.size == 0 || peer < r.size))  // NCCL refuses another peer: nothing is issued
    ++(what == operation::kind::send ? r.sends : r.recvs)[peer];
}

std::uint64_t count_of(const std::map<int, std::uint64_t>& counts, int peer) {
  const auto it = counts.find(peer);
  return it == counts.end() ? 0 : it->second;
}

// Every communicator with a target has issued at least what it asks.
bool at_targets(const cut_state& s) {
  for (const auto& r : s.records) {
    const auto it = s.targets.find({r->id, r->rank});
    if (it == s.targets.end()) continue;
    const control::comm_count& t = it->second;
    if (r->ops < t.ops) return false;
    for (const auto& [peer, n] : t.sends)
      if (count_of(r->sends, peer) < n) return false;
    for (const auto& [peer, n] : t.recvs)
      if (count_of(r->recvs, peer) < n) return false;
  }
  return true;
}

// The cut point: while the cut holds this process here, the calling thread waits (the tool's deadline, which a
// crashed tool cannot extend, lets it go at the latest).
void wait_at_cut(cut_state& s, std::unique_lock<std::mutex>& lock, const char* name) {
  auto holds = [&] {
    if (s.armed && clock::now() >= s.deadline) {
      s.armed = s.freeze = false;
      s.targets.clear();
      g_active.store(s.suspended);
    }
    return s.suspended || (s.armed && at_targets(s));
  };
  if (!holds()) return;
  ++s.waiting;
  s.where = name;
  changed(s);
  while (holds()) {
    if (s.armed)
      s.changed.wait_until(lock, s.deadline);
    else
      s.changed.wait(lock);
  }
  if (--s.waiting == 0) s.where = nullptr;
  changed(s);
}

// Outside a group: the cut point (for a call that makes a communicator, only once the cut is frozen), then the call
// counted and in flight until it returns.
template <typename Count>
bool pass_cut(const char* name, bool creation, Count&& count_it) noexcept {
  try {
    cut_state& s = state();
    std::unique_lock lock(s.mutex);
    if ((!creation || s.freeze) && g_active.load(std::memory_order_acquire)) wait_at_cut(s, lock, name);
    count_it(s);
    ++s.in_flight;
    changed(s);
    return true;
  } catch (...) {
    return false;  // out of memory for the records: the call goes uncounted, as if the shim were not there
  }
}

void returned() noexcept {
  cut_state& s = state();
  std::lock_guard lock(s.mutex);
  --s.in_flight;
  changed(s);
}

}  // namespace

std::uint64_t id_of_unique_ids(const void* ids, std::size_t bytes) noexcept { return fnv1a(ids, bytes); }

std::uint64_t id_of_split(void* parent, int color, const char* how) noexcept {
  try {
    cut_state& s = state();
    std::lock_guard lock(s.mutex);
    record* r = record_for(s, parent);
    const std::uint64_t seq = r->splits++;
    std::uint64_t h = fnv1a(&r->id, sizeof r->id);
    h = fnv1a(&seq, sizeof seq, h);
    h = fnv1a(&color, sizeof color, h);
    return fnv1a(how, std::char_traits<char>::length(how), h);
  } catch (...) {
    return id_of_local(parent);
  }
}

std::uint64_t id_of_local(void* comm) noexcept {
  const pid_t pid = ::getpid();
  return fnv1a(&comm, sizeof comm, fnv1a(&pid, sizeof pid));
}

operation::operation(const char* name, void* comm, kind k, int peer) noexcept {
  if (t_group.depth > 0) {
    try {
      t_group.operations.push_back({comm, k, peer});
    } catch (...) {
      // out of memory: this operation goes uncounted
    }
    return;
  }
  counted_outside_group_ = pass_cut(name, false, [&](cut_state& s) { count(*record_for(s, comm), k, peer); });
}

operation::~operation() {
  if (counted_outside_group_) returned();
}

creation::creation(const char* name, std::uint64_t id, int rank, int size, void* parent) noexcept
    : id_(id), rank_(rank) {
  auto make = [&](cut_state& s) {
    auto r = std::make_unique<record>();
    r->id = id;
    r->rank = rank;
    r->size = size;
    r->ops = 1;
    r->bound = false;
    s.records.push_back(std::move(r));
    if (parent != nullptr) ++record_for(s, parent)->ops;
  };
  if (t_group.depth > 0) {
    // Inside a group (a non-blocking creation): counted now, its cut point having been the group's start.
    try {
      cut_state& s = state();
      std::lock_guard lock(s.mutex);
      make(s);
      changed(s);
    } catch (...) {
    }
    return;
  }
  // Not held here while the cut is being aimed: the other members may already wait inside theirs (the creation
  // blocks until all are in), and the tool brings no rank to a communicator it has not made yet. Once every rank is
  // at the cut (frozen), held as an operation is. Counted at once, it is in flight until made.
  counted_outside_group_ = pass_cut(name, true, make);
}

creation::~creation() {
  if (counted_outside_group_) returned();
}

void creation::bind(void* comm, int rank, int size) noexcept {
  if (comm == nullptr) return;
  try {
    cut_state& s = state();
    std::lock_guard lock(s.mutex);
    for (auto it = s.records.rbegin(); it != s.records.rend(); ++it)
      if ((*it)->id == id_ && (*it)->rank == rank_ && !(*it)->bound) {
        (*it)->rank = rank;
        (*it)->size = size;
        (*it)->bound = true;
        s.by_handle[comm] = it->get();
        changed(s);
        return;
      }
  } catch (...) {
  }
}

void group_start(const char* name) noexcept {
  if (t_group.depth++ > 0) return;
  t_group.in_flight = pass_cut(name, false, [](cut_state&) {});
}

void group_end(bool issued) noexcept {
  if (t_group.depth == 0 || --t_group.depth > 0) return;
  try {
    cut_state& s = state();
    std::lock_guard lock(s.mutex);
    if (issued)
      for (const auto& op : t_group.operations) count(*record_for(s, op.comm), op.what, op.peer);
    changed(s);
  } catch (...) {
  }
  t_group.operations.clear();
}

void group_returned() noexcept {
  if (t_group.depth > 0 || !t_group.in_flight) return;
  t_group.in_flight = false;
  returned();
}

std::uint64_t arm(clock::time_point deadline) noexcept {
  cut_state& s = state();
  std::lock_guard lock(s.mutex);
  if (s.armed && clock::now() < s.deadline) return 0;
  s.armed = true;
  s.freeze = false;
  s.session += 1;
  s.deadline = deadline;
  s.targets.clear();
  g_active.store(true, std::memory_order_release);
  changed(s);
  return s.session;
}

void set_targets(const std::vector<control::comm_count>& targets, bool freeze) noexcept {
  try {
    cut_state& s = state();
    std::lock_guard lock(s.mutex);
    s.targets.clear();
    for (const auto& t : targets) s.targets[{t.id, t.rank}] = t;
    s.freeze = freeze;
    changed(s);
  } catch (...) {
  }
}

void disarm(std::uint64_t session) noexcept {
  cut_state& s = state();
  std::lock_guard lock(s.mutex);
  if (session != s.session) return;  // another connection armed it since (this one's deadline had passed)
  s.armed = s.freeze = false;
  s.targets.clear();
  g_active.store(s.suspended, std::memory_order_release);
  changed(s);
}

bool armed() noexcept {
  cut_state& s = state();
  std::lock_guard lock(s.mutex);
  return s.armed && clock::now() < s.deadline;
}

control::cut_status status() {
  cut_state& s = state();
  std::lock_guard lock(s.mutex);
  control::cut_status st;
  st.armed = s.armed && clock::now() < s.deadline;
  st.waiting = s.waiting;
  st.in_flight = s.in_flight;
  st.where = s.where != nullptr ? s.where : "";
  for (const auto& r : s.records) {
    if (!r->bound && r->rank < 0) continue;  // a split under way: its parent's count says it
    control::comm_count c{r->id, r->rank, r->size, r->ops, {}, {}};
    for (const auto& [peer, n] : r->sends) c.sends.push_back({peer, n});
    for (const auto& [peer, n] : r->recvs) c.recvs.push_back({peer, n});
    st.comms.push_back(std::move(c));
  }
  return st;
}

std::uint64_t generation() noexcept { return g_generation.load(std::memory_order_acquire); }

void hold_while_suspended(bool hold) noexcept {
  cut_state& s = state();
  std::lock_guard lock(s.mutex);
  s.suspended = hold;
  g_active.store(s.armed || hold, std::memory_order_release);
  changed(s);
}

}  // namespace vmmckpt::detail::job_cut
