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
  void enter();
  void leave();

  // Closes and waits until no call is inside. False when the deadline passed
  // first; the gate is then open again.
  bool close(std::chrono::steady_clock::time_point deadline);
  void open();
  bool is_closed() const { return closed_.load(std::memory_order_acquire); }
  // How many calls have come through so far: the pools' measure of work submitted.
  std::uint64_t entered() const { return entered_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::int64_t> inside_{0};
  std::atomic<bool> closed_{false};
  alignas(64) std::atomic<std::uint64_t> entered_{0};  // a cache line of its own: every launch bumps it
  std::mutex mutex_;
  std::condition_variable changed_;
};

work_gate& the_gate();

class gate_scope {
 public:
  gate_scope();
  ~gate_scope();
  gate_scope(const gate_scope&) = delete;
  gate_scope& operator=(const gate_scope&) = delete;
};

}  // namespace vmmckpt::detail
