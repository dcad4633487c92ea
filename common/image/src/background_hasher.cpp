// Hashing on a helper thread while the caller does I/O (image reader and writer).
#include "image_detail.hpp"

namespace vmmckpt::image::detail {

background_hasher::background_hasher() : thread_([this] { run(); }) {}

background_hasher::~background_hasher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void background_hasher::start(XXH3_state_t* state, const void* p, std::size_t n) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  state_ = state;
  p_ = p;
  n_ = n;
  busy_ = true;
  lock.unlock();
  cv_.notify_all();
}

void background_hasher::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
}

void background_hasher::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return busy_ || stop_; });
    if (busy_) {
      lock.unlock();
      checksum_update(state_, p_, n_);
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    } else if (stop_) {
      return;
    }
  }
}

}  // namespace vmmckpt::image::detail
