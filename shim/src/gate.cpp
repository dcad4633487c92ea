// The work gate: lets calls through while open, holds them at the door while a dump has it closed.
#include "gate.hpp"

namespace vmmckpt::detail {
namespace {
// Gated calls of this thread currently inside, and whether the outermost one submits work.
thread_local int depth = 0;
thread_local bool outer_work = false;
thread_local int my_stripe = -1;
std::atomic<int> next_stripe{0};
}  // namespace

std::atomic<std::uint64_t>& work_gate::counter(bool work) {
  if (work) return state_;
  if (my_stripe < 0) my_stripe = next_stripe.fetch_add(1, std::memory_order_relaxed) % stripe_count;
  return stripes_[my_stripe].inside;
}

bool work_gate::drained() const {
  if ((state_.load(std::memory_order_seq_cst) & inside_mask) != 0) return false;
  for (const stripe& s : stripes_)
    if (s.inside.load(std::memory_order_seq_cst) != 0) return false;
  return true;
}

// A call stepped out while the gate is closed: the closer re-counts (closing is rare, so every such
// step wakes it rather than working out whether it was the last).
void work_gate::wake_closer() {
  std::lock_guard lock(mutex_);
  changed_.notify_all();
}

void work_gate::enter(bool work) {
  std::atomic<std::uint64_t>& inside = counter(work);
  for (;;) {
    // Dekker with close(): this thread counts itself in, then looks at closed_; the closer sets
    // closed_, then looks at the counts. One of the two sees the other (all seq_cst).
    inside.fetch_add(1, std::memory_order_seq_cst);
    if (!closed_.load(std::memory_order_seq_cst)) return;
    // Closed: step back out so the closer can finish draining, then wait.
    inside.fetch_sub(1, std::memory_order_seq_cst);
    wake_closer();
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !closed_.load(std::memory_order_acquire); });
  }
}

void work_gate::leave(bool work) {
  if (work)
    state_.fetch_add(one_returned, std::memory_order_seq_cst);
  else
    counter(false).fetch_sub(1, std::memory_order_seq_cst);
  if (closed_.load(std::memory_order_seq_cst)) wake_closer();
}

bool work_gate::close(std::chrono::steady_clock::time_point deadline) {
  closed_.store(true, std::memory_order_seq_cst);
  std::unique_lock lock(mutex_);
  const bool ok = changed_.wait_until(lock, deadline, [this] { return drained(); });
  if (!ok) {
    closed_.store(false, std::memory_order_seq_cst);
    changed_.notify_all();
  }
  return ok;
}

void work_gate::open() {
  {
    std::lock_guard lock(mutex_);
    closed_.store(false, std::memory_order_seq_cst);
  }
  changed_.notify_all();
}

work_gate& the_gate() {
  static work_gate gate;
  return gate;
}

gate_scope::gate_scope(kind k) {
  if (depth++ == 0) {
    outer_work = k == submits_work;
    the_gate().enter(outer_work);
  }
}

gate_scope::~gate_scope() {
  if (--depth == 0) the_gate().leave(outer_work);
}

}  // namespace vmmckpt::detail
