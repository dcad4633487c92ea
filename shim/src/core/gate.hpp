// The work gate: every entry point that submits GPU work or changes the pool passes it; a dump closes it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include <pthread.h>

namespace vmmckpt::detail {

// Each thread passes through a slot of its own: open, a call writes only that slot's cache line, with
// plain stores and no fence. Closing pays instead: it makes every running thread of the process pass
// a full memory barrier (membarrier(2)) before it reads the slots, so a thread either shows up there
// as inside or sees the gate closed. Where the kernel lacks membarrier, every call fences itself.
//
// Closing stops new calls at the door (they wait for the gate to open again) and waits for the calls
// already inside to return. A thread already inside may call through again (nested).
class work_gate {
 public:
  work_gate();

  // The calling thread's outermost gated call (gate_scope counts the nested ones). `work`: the call
  // may submit GPU work and is counted in submitted() when it returns; allocation and free pass the
  // gate too (the allocation table must not change during a dump) but are not counted.
  void enter();
  void leave(bool work);

  // Closes and waits until no call is inside. False when the deadline passed first (or the threads
  // could not be made to fence); the gate is then open again.
  bool close(std::chrono::steady_clock::time_point deadline);
  void open();
  bool is_closed() const { return closed_.load(std::memory_order_acquire); }
  // How many calls that may submit work have returned so far: the pools' measure of work submitted.
  // Counted on the way out, not in: a synchronize that reads this count covers every call it
  // counts, whose work was all handed to the driver before the count moved. Never goes down.
  std::uint64_t submitted() const;

  // Threads with a slot of their own at most; threads beyond share one slot (atomic updates).
  static constexpr int slot_count = 256;

 private:
  struct alignas(64) inside_word {
    std::atomic<std::uint32_t> calls{0};  // this slot's calls inside now (0 or 1 unless shared)
  };
  // Apart from inside_word, so that the work count's readers (every free) do not share a cache line
  // with the flag that allocations and frees write.
  struct alignas(64) returned_word {
    std::atomic<std::uint64_t> calls{0};  // this slot's calls that submit work and have returned
  };
  int take_slot();                                  // a free slot for the calling thread, or shared_slot
  static void on_thread_exit(void* slot_plus_one);  // gives the thread's slot back
  bool fence_all_threads();                         // false when no way to make the threads fence is left
  void after_fork_in_child();
  bool drained() const;
  void wake_closer();

  static constexpr int shared_slot = slot_count;  // the last of the arrays: RMW updates
  std::array<inside_word, slot_count + 1> inside_;
  std::array<returned_word, slot_count + 1> returned_;
  std::array<std::atomic<bool>, slot_count> taken_{};
  std::atomic<int> slots_used_{0};  // slots [0, slots_used_) have been handed out at least once
  std::mutex slots_mutex_;          // taking a slot
  pthread_key_t exit_key_{};        // its destructor gives a thread's slot back
  bool exit_key_made_ = false;
  bool membarrier_ = false;                      // registered at construction: calls need no fence of their own
  alignas(64) std::atomic<bool> closed_{false};  // read by every call, written only by close and open
  std::mutex mutex_;
  std::condition_variable changed_;
};

work_gate& the_gate();

class gate_scope {
 public:
  enum kind { submits_work, no_work };
  explicit gate_scope(kind k = submits_work);
  ~gate_scope();
  gate_scope(const gate_scope&) = delete;
  gate_scope& operator=(const gate_scope&) = delete;
};

}  // namespace vmmckpt::detail
