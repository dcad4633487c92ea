// The work gate: every entry point that submits GPU work or changes the pool passes it; a dump closes it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace vmmckpt::detail {

// Open, a call costs two atomic operations. Closing stops new calls at the
// door (they wait for the gate to open again) and waits for the calls already
// inside to return. A thread already inside may call through again (nested).
class work_gate {
 public:
  // `work`: the call may submit GPU work and is counted in entered(); allocation and free pass
  // the gate too (the allocation table must not change during a dump) but are not counted.
  void enter(bool work = true);
  void leave();

  // Closes and waits until no call is inside. False when the deadline passed
  // first; the gate is then open again.
  bool close(std::chrono::steady_clock::time_point deadline);
  void open();
  bool is_closed() const { return closed_.load(std::memory_order_acquire); }
  // How many calls have come in so far (modulo 2^40): the pools' measure of work submitted.
  std::uint64_t entered() const { return state_.load(std::memory_order_acquire) >> count_bits; }

 private:
  // One word for both, so that a call still costs two atomic operations: the low bits count the
  // calls inside now, the high bits every call that came in.
  static constexpr int count_bits = 24;
  static constexpr std::uint64_t inside_mask = (1ULL << count_bits) - 1;
  static constexpr std::uint64_t one_entry = (1ULL << count_bits) + 1;
  std::uint64_t inside() const { return state_.load(std::memory_order_seq_cst) & inside_mask; }
  std::atomic<std::uint64_t> state_{0};
  std::atomic<bool> closed_{false};
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
