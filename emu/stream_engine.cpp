// Worker-thread execution of stream work: strict FIFO order, waiting and querying by sequence number.
#include "stream_engine.hpp"

#include <unistd.h>

#include <thread>

namespace vmmckpt::emu {

stream_engine::stream_engine(context* owner, unsigned flags, int priority, bool legacy)
    : owner_(owner), flags_(flags), priority_(priority), legacy_(legacy) {}

// A forked child has our memory but not our worker thread: queued work would wait forever. The
// child gets an empty, idle stream (the real driver does not support CUDA in a forked child at all;
// this only keeps a child that touches the emulator from hanging).
void stream_engine::forget_parent_state_after_fork() {
  if (worker_running_ && worker_pid_ != getpid()) {
    worker_running_ = false;
    queue_.clear();
    completed_ = submitted_;
  }
}

std::uint64_t stream_engine::enqueue(task work) {
  std::unique_lock lock(mutex_);
  forget_parent_state_after_fork();
  queue_.push_back(std::move(work));
  const std::uint64_t seq = ++submitted_;
  if (!worker_running_) {
    // The thread owns a reference so a destroyed stream still drains its queue (real semantics:
    // cuStreamDestroy returns at once and pending work completes). Detached: nobody joins it.
    std::thread(&stream_engine::run, shared_from_this()).detach();
    worker_running_ = true;
    worker_pid_ = getpid();
  }
  lock.unlock();
  work_ready_.notify_one();
  return seq;
}

void stream_engine::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return !queue_.empty() || retired_; });
    if (queue_.empty()) break;  // retired and drained
    task work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      work();
    } catch (...) {
      // A task is emulator code or a user host function: neither may take the worker down.
    }
    work = nullptr;  // destroy captured state outside the lock
    lock.lock();
    ++completed_;
    work_done_.notify_all();
  }
  worker_running_ = false;
}

void stream_engine::wait_for(std::uint64_t seq) {
  std::unique_lock lock(mutex_);
  forget_parent_state_after_fork();
  work_done_.wait(lock, [&] { return completed_ >= seq; });
}

void stream_engine::synchronize() {
  std::unique_lock lock(mutex_);
  forget_parent_state_after_fork();
  const std::uint64_t target = submitted_;
  work_done_.wait(lock, [&] { return completed_ >= target; });
}

bool stream_engine::is_done(std::uint64_t seq) {
  std::lock_guard lock(mutex_);
  forget_parent_state_after_fork();
  return completed_ >= seq;
}

bool stream_engine::idle() {
  std::lock_guard lock(mutex_);
  forget_parent_state_after_fork();
  return completed_ == submitted_;
}

std::uint64_t stream_engine::last_submitted() {
  std::lock_guard lock(mutex_);
  return submitted_;
}

void stream_engine::retire() {
  {
    std::lock_guard lock(mutex_);
    retired_ = true;
  }
  work_ready_.notify_all();
}

}  // namespace vmmckpt::emu
