// SIGINT and SIGTERM during dump and suspend: noted, so that the operation stops cleanly.
#include "interrupts.hpp"

#include <signal.h>

namespace vmmckpt::tools {
namespace {

std::atomic<int> g_interrupt{0};
static_assert(std::atomic<int>::is_always_lock_free, "set from a signal handler");

void note_interrupt(int sig) { g_interrupt.store(sig, std::memory_order_relaxed); }

}  // namespace

const std::atomic<int>& catch_interrupts() {
  struct sigaction action {};
  action.sa_handler = note_interrupt;
  sigemptyset(&action.sa_mask);
  // SA_RESETHAND: the second Ctrl-C kills as usual. SA_RESTART: waits go on, and the copy loop
  // looks at the flag between chunks.
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  return g_interrupt;
}

}  // namespace vmmckpt::tools
