// One emulated stream: a FIFO of host-side tasks run in order by its own worker thread.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace vmmckpt::emu {

struct context;

class stream_engine : public std::enable_shared_from_this<stream_engine> {
 public:
  using task = std::function<void()>;

  stream_engine(context* owner, unsigned flags, int priority, bool legacy);
  stream_engine(const stream_engine&) = delete;
  stream_engine& operator=(const stream_engine&) = delete;

  // Queues a task; returns its sequence number (1-based). Starts the worker on first use.
  std::uint64_t enqueue(task work);
  // Blocks until every task up to and including `seq` has run.
  void wait_for(std::uint64_t seq);
  // Blocks until everything queued so far has run.
  void synchronize();
  bool is_done(std::uint64_t seq);
  bool idle();
  std::uint64_t last_submitted();
  // The worker leaves after draining the queue; the engine lives on while anyone holds it.
  void retire();

  context* owner() const { return owner_; }
  unsigned flags() const { return flags_; }
  int priority() const { return priority_; }
  bool legacy() const { return legacy_; }

 private:
  void run();
  void forget_parent_state_after_fork();

  context* const owner_;
  const unsigned flags_;
  const int priority_;
  const bool legacy_;

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<task> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool worker_running_ = false;
  bool retired_ = false;
  pid_t worker_pid_ = 0;
};

}  // namespace vmmckpt::emu
