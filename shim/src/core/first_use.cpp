// The first memory the shim serves: runs the action set at the shim's initialisation, once.
#include "core/first_use.hpp"

#include <atomic>
#include <mutex>

namespace vmmckpt::detail {
namespace {

std::atomic<first_use_action> g_action{nullptr};
std::atomic<bool> g_served{false};  // memory was served (perhaps before the action was set: another
                                    // library's constructor may allocate before ours runs)
std::atomic<bool> g_done{false};

void run_once() noexcept {
  static std::once_flag once;
  try {
    std::call_once(once, [] {
      g_action.load(std::memory_order_acquire)();
      g_done.store(true, std::memory_order_release);
    });
  } catch (...) {
    // call_once could not wait for another thread: that thread runs the action.
  }
}

}  // namespace

void on_first_served_memory(first_use_action action) noexcept {
  g_action.store(action, std::memory_order_release);
  if (g_served.load(std::memory_order_acquire)) run_once();
}

void note_served_memory() noexcept {
  if (g_done.load(std::memory_order_acquire)) return;
  g_served.store(true, std::memory_order_release);
  if (g_action.load(std::memory_order_acquire) != nullptr) run_once();
}

}  // namespace vmmckpt::detail
