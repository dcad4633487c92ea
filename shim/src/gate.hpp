// The work gate: every entry point that submits GPU work or changes the pool passes it; a dump closes it.
#pragma once

#include <array>
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
  // `work`: the call may submit GPU work and is counted in submitted() when it returns; allocation
  // and free pass the gate too (the allocation table must not change during a dump) but are not
  // counted. leave() takes the same `work` as the enter() it ends.
  void enter(bool work = true);
  void leave(bool work = true);

  // Closes and waits until no call is inside. False when the deadline passed
  // first; the gate is then open again.
  bool close(std::chrono::steady_clock::time_point deadline);
  void open();
  bool is_closed() const { return closed_.load(std::memory_order_acquire); }
  // How many calls that may submit work have returned so far (modulo 2^40): the pools' measure of
  // work submitted. Counted on the way out, not in: a synchronize that reads this count covers every
  // call it counts, whose work was all handed to the driver before the count moved.
  std::uint64_t submitted() const { return state_.load(std::memory_order_acquire) >> count_bits; }

 private:
  // Calls that submit work: one word for both, so that such a call still costs two atomic
  // operations: the low bits count the calls inside now, the high bits every call that returned.
  static constexpr int count_bits = 24;
  static constexpr std::uint64_t inside_mask = (1ULL << count_bits) - 1;
  static constexpr std::uint64_t one_returned = (1ULL << count_bits) - 1;  // +1 returned, -1 inside
  // Calls that submit none (allocation and free) count themselves in a stripe of their thread's, so
  // threads allocating at once write no shared cache line; close() adds the stripes up.
  static constexpr int stripe_count = 32;
  struct alignas(128) stripe {
    std::atomic<std::uint64_t> inside{0};
  };
  std::atomic<std::uint64_t>& counter(bool work);
  bool drained() const;
  void wake_closer();

  std::array<stripe, stripe_count> stripes_;
  alignas(128) std::atomic<std::uint64_t> state_{0};
  alignas(128) std::atomic<bool> closed_{false};  // read by every call, written only by close and open
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
