// The work gate: lets calls through while open, holds them at the door while a dump has it closed.
#include "core/gate.hpp"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace vmmckpt::detail {
namespace {

// Gated calls of this thread currently inside, whether the outermost one submits work, and the slot
// it passes through (-1: none yet). Initial-exec: the shim is preloaded, and a call reaches this
// state without a function call into the dynamic linker.
struct gate_thread {
  int depth = 0;
  bool outer_work = false;
  int slot = -1;
};
__attribute__((tls_model("initial-exec"))) thread_local gate_thread self;

long membarrier(int command) { return ::syscall(SYS_membarrier, command, 0, 0); }

work_gate* forking_gate = nullptr;  // the gate whose slots a fork() must keep consistent

}  // namespace

work_gate::work_gate() {
  // Registered once here, before any call passes: from then on calls rely on close() to fence them.
  membarrier_ = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  exit_key_made_ = pthread_key_create(&exit_key_, &work_gate::on_thread_exit) == 0;
  // Not through the_gate(): a fork while this constructor runs would wait for it there.
  forking_gate = this;
  pthread_atfork([] { forking_gate->slots_mutex_.lock(); }, [] { forking_gate->slots_mutex_.unlock(); },
                 [] { forking_gate->after_fork_in_child(); });
}

// The child has only the thread that forked: the other threads' slots are free again (their returned
// work stays counted), and none of them is inside, so a dump of the child can close the gate.
void work_gate::after_fork_in_child() {
  const int used = slots_used_.load(std::memory_order_relaxed);
  for (int s = 0; s < used; ++s) {
    if (s == self.slot) continue;
    inside_[s].calls.store(0, std::memory_order_relaxed);
    taken_[s].store(false, std::memory_order_relaxed);
  }
  inside_[shared_slot].calls.store(self.slot == shared_slot && self.depth > 0 ? 1 : 0, std::memory_order_relaxed);
  slots_mutex_.unlock();
}

int work_gate::take_slot() {
  std::lock_guard lock(slots_mutex_);
  const int used = slots_used_.load(std::memory_order_relaxed);
  int s = 0;
  while (s < used && taken_[s].load(std::memory_order_acquire)) ++s;
  if (s == slot_count) return shared_slot;
  taken_[s].store(true, std::memory_order_relaxed);
  if (s == used) slots_used_.store(used + 1, std::memory_order_release);
  // Without the key the slot is never given back: still correct, one slot fewer for later threads.
  if (exit_key_made_) pthread_setspecific(exit_key_, reinterpret_cast<void*>(static_cast<std::intptr_t>(s) + 1));
  return s;
}

void work_gate::on_thread_exit(void* slot_plus_one) {
  const int s = static_cast<int>(reinterpret_cast<std::intptr_t>(slot_plus_one)) - 1;
  if (self.depth != 0 || s < 0 || s >= slot_count) return;  // leaving from inside a call: keep it
  // Gated calls later in this thread's teardown (other keys' destructors) share the shared slot.
  self.slot = shared_slot;
  // Release: the next owner continues this slot's count of returned work from where it stands.
  the_gate().taken_[s].store(false, std::memory_order_release);
}

void work_gate::enter() {
  if (self.slot < 0) self.slot = take_slot();
  const int s = self.slot;
  std::atomic<std::uint32_t>& inside = inside_[s].calls;
  for (;;) {
    // Dekker with close(): this thread marks itself inside, then looks at closed_; the closer sets
    // closed_, makes every thread pass a barrier, then looks at the slots. One sees the other.
    if (s == shared_slot)
      inside.fetch_add(1, std::memory_order_seq_cst);
    else
      inside.store(1, std::memory_order_relaxed);
    if (membarrier_)
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler's order only
    else
      std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!closed_.load(std::memory_order_acquire)) return;
    // Closed: step back out so the closer can finish draining, then wait.
    if (s == shared_slot)
      inside.fetch_sub(1, std::memory_order_seq_cst);
    else
      inside.store(0, std::memory_order_release);
    wake_closer();
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !closed_.load(std::memory_order_acquire); });
  }
}

void work_gate::leave(bool work) {
  const int s = self.slot;
  if (s == shared_slot) {
    if (work) returned_[s].calls.fetch_add(1, std::memory_order_seq_cst);
    inside_[s].calls.fetch_sub(1, std::memory_order_seq_cst);
  } else {
    // Only this thread writes its slot: a plain increment, published with release.
    std::atomic<std::uint64_t>& returned = returned_[s].calls;
    if (work) returned.store(returned.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    inside_[s].calls.store(0, std::memory_order_release);
  }
  if (membarrier_)
    std::atomic_signal_fence(std::memory_order_seq_cst);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
  // A closer that saw this thread inside has fenced it since: this load then sees the gate closed.
  if (closed_.load(std::memory_order_acquire)) wake_closer();
}

std::uint64_t work_gate::submitted() const {
  std::uint64_t n = returned_[shared_slot].calls.load(std::memory_order_acquire);
  const int used = slots_used_.load(std::memory_order_acquire);
  for (int s = 0; s < used; ++s) n += returned_[s].calls.load(std::memory_order_acquire);
  return n;
}

bool work_gate::fence_all_threads() {
  if (!membarrier_) return true;  // every call fences itself
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
  // A child of fork() may have to register again.
  if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return true;
  return membarrier(MEMBARRIER_CMD_GLOBAL) == 0;  // the same guarantee, after a grace period
}

bool work_gate::drained() const {
  const int used = slots_used_.load(std::memory_order_acquire);
  for (int s = 0; s < used; ++s)
    if (inside_[s].calls.load(std::memory_order_acquire) != 0) return false;
  return inside_[shared_slot].calls.load(std::memory_order_seq_cst) == 0;
}

// A call stepped out while the gate is closed: the closer re-counts (closing is rare, so every such
// step wakes it rather than working out whether it was the last).
void work_gate::wake_closer() {
  std::lock_guard lock(mutex_);
  changed_.notify_all();
}

bool work_gate::close(std::chrono::steady_clock::time_point deadline) {
  closed_.store(true, std::memory_order_seq_cst);
  bool ok = fence_all_threads();
  if (ok) {
    std::unique_lock lock(mutex_);
    ok = changed_.wait_until(lock, deadline, [this] { return drained(); });
  }
  if (!ok) open();
  return ok;
}

void work_gate::open() {
  {
    std::lock_guard lock(mutex_);
    closed_.store(false, std::memory_order_seq_cst);
  }
  changed_.notify_all();
}

// Never destroyed: threads may still pass the gate while the process exits.
work_gate& the_gate() {
  static work_gate* gate = new work_gate;
  return *gate;
}

gate_scope::gate_scope(kind k) {
  if (self.depth++ == 0) {
    self.outer_work = k == submits_work;
    the_gate().enter();
  }
}

gate_scope::~gate_scope() {
  if (--self.depth == 0) the_gate().leave(self.outer_work);
}

}  // namespace vmmckpt::detail
