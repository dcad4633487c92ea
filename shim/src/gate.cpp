// The work gate: lets calls through while open, holds them at the door while a dump has it closed.
#include "gate.hpp"

namespace vmmckpt::detail {
namespace {
thread_local int depth = 0;  // gated calls of this thread currently inside
}

void work_gate::enter(bool work) {
  for (;;) {
    state_.fetch_add(work ? one_entry : 1, std::memory_order_seq_cst);
    if (!closed_.load(std::memory_order_seq_cst)) return;
    // Closed: step back out so the closer can finish draining, then wait.
    if ((state_.fetch_sub(1, std::memory_order_seq_cst) & inside_mask) == 1) {
      std::lock_guard lock(mutex_);
      changed_.notify_all();
    }
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !closed_.load(std::memory_order_acquire); });
  }
}

void work_gate::leave() {
  if ((state_.fetch_sub(1, std::memory_order_seq_cst) & inside_mask) == 1 && closed_.load(std::memory_order_seq_cst)) {
    std::lock_guard lock(mutex_);
    changed_.notify_all();
  }
}

bool work_gate::close(std::chrono::steady_clock::time_point deadline) {
  closed_.store(true, std::memory_order_seq_cst);
  std::unique_lock lock(mutex_);
  const bool drained =
      changed_.wait_until(lock, deadline, [this] { return inside() == 0; });
  if (!drained) {
    closed_.store(false, std::memory_order_seq_cst);
    changed_.notify_all();
  }
  return drained;
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
  if (depth++ == 0) the_gate().enter(k == submits_work);
}

gate_scope::~gate_scope() {
  if (--depth == 0) the_gate().leave();
}

}  // namespace vmmckpt::detail
