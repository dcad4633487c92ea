// A mutex that spins briefly before it sleeps: allocation and free hold the pool's lock for well under
// a microsecond, and with threads allocating at once, sleeping and waking in the kernel costs ~20 us.
#pragma once

#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace vmmckpt {

class adaptive_mutex {
 public:
  void lock() {
    for (int i = 0; i < spins; ++i) {
      if (m_.try_lock()) return;
      relax();
    }
    m_.lock();  // held long (the pool is growing, or waiting for the GPU): sleep
  }
  bool try_lock() { return m_.try_lock(); }
  void unlock() { m_.unlock(); }

 private:
  static constexpr int spins = 200;  // about 10 us of pause instructions
  static void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  std::mutex m_;
};

}  // namespace vmmckpt
