// Where the threads of a job's operation, one per rank, wait for each other: every rank prepared before the cut,
// every rank's bytes safe before any is released. One failure fails them all, so that no rank goes on alone.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {

class rendezvous {
 public:
  // `step` runs once, in the thread that arrives last, before any goes on; what it throws, every thread throws.
  explicit rendezvous(std::size_t parties, std::function<void()> step = {}) : left_(parties), step_(std::move(step)) {}

  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    if (--left_ == 0) {
      if (step_) {
        try {
          step_();
        } catch (...) {
          failure_ = std::current_exception();
        }
      }
      done_ = true;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return done_ || failure_ != nullptr; });
    }
    if (failure_) std::rethrow_exception(failure_);
  }

  // A thread that will not arrive: every other one gives up, saying why.
  void abandon(const std::string& why) noexcept {
    std::lock_guard lock(mutex_);
    if (done_ || failure_) return;
    failure_ = std::make_exception_ptr(other_rank_failed(why));
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t left_;
  std::function<void()> step_;
  bool done_ = false;
  std::exception_ptr failure_;
};

}  // namespace vmmckpt::ckpt
