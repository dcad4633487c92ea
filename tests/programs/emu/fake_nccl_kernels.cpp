// The stand-in NCCL's "kernels": host functions on the caller's stream (the emulator runs no kernels) that move and
// reduce the data between the ranks through their mapped slots, waiting on the sequence numbers the peers publish in
// their flags. They call no CUDA function: emulated device memory is host memory at its device address.
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

#include "fake_nccl_internal.hpp"

namespace fake_nccl {
namespace {

using clock = std::chrono::steady_clock;

std::uint64_t read(std::uint64_t& word) { return std::atomic_ref<std::uint64_t>(word).load(std::memory_order_acquire); }

// Everything written before (the slot's bytes) is visible to a peer that reads the number with read().
void publish(std::uint64_t& word, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(word).store(value, std::memory_order_release);
}

// A process that is gone (or a zombie) will never publish anything.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

void fail(ncclComm& comm, ncclResult_t error) {
  int none = ncclSuccess;
  comm.async_error.compare_exchange_strong(none, error);
}

// How a host function waits for its peers: a few yields, then sleeps of up to half a millisecond. It waits as long
// as it takes (NCCL does too) and gives up only when a communicator was aborted or has failed, or a peer's process
// is gone, which it says on stderr.
class waiter {
 public:
  explicit waiter(std::vector<ncclComm*> comms) : comms_(std::move(comms)) {}
  void progressed() { idle_ = 0; }
  bool pause(const char* what);

 private:
  bool peers_alive(const char* what);
  std::vector<ncclComm*> comms_;
  unsigned idle_ = 0;
  clock::time_point next_check_ = clock::now() + std::chrono::seconds(1);
};

bool waiter::pause(const char* what) {
  if (++idle_ < 16)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(500u, 10u * idle_)));
  for (ncclComm* c : comms_)
    if (c->aborted.load() || c->async_error.load() != ncclSuccess) return false;
  if (clock::now() < next_check_) return true;
  next_check_ = clock::now() + std::chrono::seconds(1);
  return peers_alive(what);
}

bool waiter::peers_alive(const char* what) {
  for (ncclComm* c : comms_) {
    for (int r = 0; r < c->nranks; ++r) {
      const pid_t pid = c->peers[static_cast<std::size_t>(r)].pid;
      if (r == c->rank || alive(pid)) continue;
      warn(c, "rank %d (pid %d) is gone while this rank waits for %s", r, static_cast<int>(pid), what);
      fail(*c, ncclRemoteError);
      return false;
    }
  }
  return true;
}

template <class T>
T combine(T a, T b, ncclRedOp_t red) {
  if (red == ncclMax) return a < b ? b : a;
  if (red == ncclMin) return b < a ? b : a;
  if constexpr (std::is_integral_v<T>) {  // wrapping, as the GPU's integers do
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(red == ncclSum ? static_cast<U>(static_cast<U>(a) + static_cast<U>(b))
                                         : static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return red == ncclSum ? a + b : a * b;
  }
}

// dst[i] = srcs[0][i] op srcs[1][i] op ..., always in rank order, so every rank gets the same bits.
template <class T>
void reduce_typed(char* dst, const char* const* srcs, int nsrcs, std::size_t n, ncclRedOp_t red) {
  for (std::size_t i = 0; i < n; ++i) {
    T acc;
    std::memcpy(&acc, srcs[0] + i * sizeof(T), sizeof(T));
    for (int s = 1; s < nsrcs; ++s) {
      T v;
      std::memcpy(&v, srcs[s] + i * sizeof(T), sizeof(T));
      acc = combine(acc, v, red);
    }
    std::memcpy(dst + i * sizeof(T), &acc, sizeof(T));
  }
}

void reduce(ncclDataType_t type, ncclRedOp_t red, char* dst, const char* const* srcs, int nsrcs, std::size_t n) {
  switch (type) {
    case ncclInt8: return reduce_typed<std::int8_t>(dst, srcs, nsrcs, n, red);
    case ncclUint8: return reduce_typed<std::uint8_t>(dst, srcs, nsrcs, n, red);
    case ncclInt32: return reduce_typed<std::int32_t>(dst, srcs, nsrcs, n, red);
    case ncclUint32: return reduce_typed<std::uint32_t>(dst, srcs, nsrcs, n, red);
    case ncclInt64: return reduce_typed<std::int64_t>(dst, srcs, nsrcs, n, red);
    case ncclUint64: return reduce_typed<std::uint64_t>(dst, srcs, nsrcs, n, red);
    case ncclFloat32: return reduce_typed<float>(dst, srcs, nsrcs, n, red);
    case ncclFloat64: return reduce_typed<double>(dst, srcs, nsrcs, n, red);
    default: return;  // refused when issued
  }
}

bool in_blocks(const op& o) { return o.what == kind::all_gather || o.what == kind::reduce_scatter; }

// Elements per step: a step's contribution fills at most the slot's collective region (all ranks' blocks of it,
// for the gathers and scatters).
std::size_t step_elements(const op& o) {
  return coll_region / (type_size(o.type) * (in_blocks(o) ? static_cast<std::size_t>(o.comm->nranks) : 1));
}

// This rank's contribution to elements [first, first + n) into its own slot.
void deposit(const op& o, std::size_t first, std::size_t n) {
  const ncclComm& c = *o.comm;
  const std::size_t e = type_size(o.type);
  char* slot = c.slot_of(c.rank);
  switch (o.what) {
    case kind::broadcast:
      if (c.rank == o.root) std::memcpy(slot, o.send + first * e, n * e);
      return;
    case kind::reduce_scatter:
      for (int b = 0; b < c.nranks; ++b)
        std::memcpy(slot + static_cast<std::size_t>(b) * n * e,
                    o.send + (static_cast<std::size_t>(b) * o.count + first) * e, n * e);
      return;
    default: std::memcpy(slot, o.send + first * e, n * e); return;  // all_reduce, reduce, all_gather
  }
}

void reduce_slots(const op& o, std::size_t offset, std::size_t first, std::size_t n) {
  const ncclComm& c = *o.comm;
  const char* srcs[max_ranks];
  for (int r = 0; r < c.nranks; ++r) srcs[r] = c.slot_of(r) + offset;
  reduce(o.type, o.red, o.recv + first * type_size(o.type), srcs, c.nranks, n);
}

// Elements [first, first + n) of the result, from every rank's slot.
void consume(const op& o, std::size_t first, std::size_t n) {
  const ncclComm& c = *o.comm;
  const std::size_t e = type_size(o.type);
  switch (o.what) {
    case kind::all_reduce: return reduce_slots(o, 0, first, n);
    case kind::reduce:
      if (c.rank == o.root) reduce_slots(o, 0, first, n);
      return;
    case kind::broadcast: std::memcpy(o.recv + first * e, c.slot_of(o.root), n * e); return;
    case kind::all_gather:
      for (int r = 0; r < c.nranks; ++r)
        std::memcpy(o.recv + (static_cast<std::size_t>(r) * o.count + first) * e, c.slot_of(r), n * e);
      return;
    case kind::reduce_scatter: return reduce_slots(o, static_cast<std::size_t>(c.rank) * n * e, first, n);
    default: return;
  }
}

bool wait_all(ncclComm& c, std::uint64_t rank_flags::*field, std::uint64_t at_least, waiter& w, const char* what) {
  for (int r = 0; r < c.nranks; ++r)
    while (read(c.flags_of(r)->*field) < at_least)
      if (!w.pause(what)) return false;
  w.progressed();
  return true;
}

// Each step: my contribution into my slot, published; every peer's awaited; the result read from all the slots;
// "done reading" published, and every peer's awaited, so no slot is overwritten while a peer reads it and the
// operation never completes before every rank has taken part.
bool run_collective(const op& o, waiter& w) {
  ncclComm& c = *o.comm;
  const std::size_t chunk = step_elements(o);
  rank_flags& mine = *c.flags_of(c.rank);
  for (std::uint64_t i = 0; i < o.steps; ++i) {
    const std::uint64_t step = o.first_step + i;
    const std::size_t first = std::min<std::size_t>(i * chunk, o.count);
    const std::size_t n = std::min(chunk, o.count - first);
    deposit(o, first, n);
    publish(mine.ready, step);
    if (!wait_all(c, &rank_flags::ready, step, w, "the peers' contributions to a collective")) return false;
    consume(o, first, n);
    publish(mine.done, step);
    if (!wait_all(c, &rank_flags::done, step, w, "the peers to finish reading a collective's slots")) return false;
  }
  return true;
}

// Moves a send or a receive on as far as its peer allows; true when it moved. A send deposits its message in my
// slot's region for the peer once the peer acknowledged the one before, publishes it, and completes when the peer
// acknowledges it; a receive waits for the peer's message, copies it and acknowledges it.
enum class p2p_state { waiting, deposited, complete };

bool advance(const op& o, p2p_state& state) {
  const ncclComm& c = *o.comm;
  const int me = c.rank, peer = o.root;
  const std::size_t bytes = o.count * type_size(o.type);
  if (o.what == kind::send) {
    std::uint64_t& acked = c.flags_of(peer)->acked[me];
    if (state == p2p_state::waiting && read(acked) >= o.message - 1) {
      std::memcpy(c.slot_of(me) + coll_region + static_cast<std::size_t>(peer) * p2p_region, o.send, bytes);
      publish(c.flags_of(me)->sent[peer], o.message);
      state = p2p_state::deposited;
      return true;
    }
    if (state != p2p_state::deposited || read(acked) < o.message) return false;
    state = p2p_state::complete;
    return true;
  }
  if (read(c.flags_of(peer)->sent[me]) < o.message) return false;
  std::memcpy(o.recv, c.slot_of(peer) + coll_region + static_cast<std::size_t>(me) * p2p_region, bytes);
  publish(c.flags_of(me)->acked[peer], o.message);
  state = p2p_state::complete;
  return true;
}

// All the sends and receives of a launch progress together, so that any pairing a group allows (a ring, both ways
// between two ranks) completes.
bool run_p2p(const std::vector<const op*>& ops, waiter& w) {
  std::vector<p2p_state> states(ops.size(), p2p_state::waiting);
  for (std::size_t left = ops.size(); left > 0;) {
    bool moved = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (states[i] == p2p_state::complete || !advance(*ops[i], states[i])) continue;
      moved = true;
      if (states[i] == p2p_state::complete) --left;
    }
    if (moved)
      w.progressed();
    else if (!w.pause("a point-to-point message"))
      return false;
  }
  return true;
}

bool run_ops(const launch& l, waiter& w) {
  // A communicator's launches run in the order they were issued, whatever streams they are on.
  for (const auto& [c, ticket] : l.tickets)
    while (c->tickets_done.load(std::memory_order_acquire) + 1 != ticket)
      if (!w.pause("the communicator's earlier work")) return false;
  for (const auto& [c, ticket] : l.tickets)
    if (c->aborted.load() || c->async_error.load() != ncclSuccess) return false;
  std::vector<const op*> p2p;
  for (const op& o : l.ops) {
    if (o.what == kind::send || o.what == kind::recv)
      p2p.push_back(&o);
    else if (!run_collective(o, w))
      return false;
  }
  return run_p2p(p2p, w);
}

}  // namespace

std::size_t type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

bool supported_reduction(ncclDataType_t type, ncclRedOp_t red) {
  const bool reducible_type = type_size(type) != 0 && type != ncclFloat16 && type != ncclBfloat16 &&
                              type != ncclFloat8e4m3 && type != ncclFloat8e5m2;
  return reducible_type && (red == ncclSum || red == ncclProd || red == ncclMax || red == ncclMin);
}

std::uint64_t steps_of(const op& o) {
  const std::size_t chunk = step_elements(o);
  return std::max<std::uint64_t>(1, (o.count + chunk - 1) / chunk);
}

void CUDA_CB run_launch(void* launch_ptr) {
  std::unique_ptr<launch> l(static_cast<launch*>(launch_ptr));
  std::vector<ncclComm*> comms;
  for (const auto& [c, ticket] : l->tickets) comms.push_back(c);
  waiter w(comms);
  if (!run_ops(*l, w)) {
    // The numbers of the communicators it touched are out of step with their peers' now: none of them runs more.
    int error = ncclRemoteError;
    for (ncclComm* c : comms)
      if (c->async_error.load() != ncclSuccess) error = c->async_error.load();
    for (ncclComm* c : comms) fail(*c, static_cast<ncclResult_t>(error));
  }
  for (const auto& [c, ticket] : l->tickets) {
    c->tickets_done.store(ticket, std::memory_order_release);
    c->in_flight.fetch_sub(1, std::memory_order_acq_rel);  // after this, the communicator may be destroyed
  }
}

}  // namespace fake_nccl
