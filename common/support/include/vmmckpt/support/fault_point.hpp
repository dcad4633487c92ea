// Fault injection for the reliability tests: named points where a process can be made to die, stop or pause.
#pragma once

#include <signal.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace vmmckpt {

// VMMCKPT_TEST_FAULT lists what to do at which point, comma-separated: `POINT` or `POINT=kill` kills
// the process there with SIGKILL (as a crash or an OOM kill would, no cleanup of any kind);
// `POINT=stop` stops it with SIGSTOP (as Ctrl-Z, a cgroup freeze or `scontrol suspend` would);
// `POINT=pause:MS` sleeps MS milliseconds. Each entry acts once per process: a stopped program that
// continues is not stopped again by its next pass. `POINT=slow:MS` sleeps MS milliseconds at every pass
// (a slow disk under a writer). Unset, a point costs one load. Used by
// tests/emu/fault_e2e_test.cpp and the chaos test: a tool or a program failing at any phase never
// hurts the program and never leaves anything that passes verify.
// `POINT=fail` makes fault_point(POINT) return true, for a step to fail as if its work had failed.
inline bool fault_point(std::string_view name) noexcept {
  static const char* const spec = std::getenv("VMMCKPT_TEST_FAULT");
  static std::atomic<std::uint64_t> fired{0};  // bit k: entry k has acted
  if (spec == nullptr) return false;
  bool fail = false;
  int index = 0;
  for (std::string_view rest = spec; !rest.empty(); ++index) {
    const std::size_t comma = rest.find(',');
    const std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t eq = entry.find('=');
    if (entry.substr(0, eq) != name) continue;
    const std::string_view action = eq == std::string_view::npos ? "kill" : entry.substr(eq + 1);
    const bool every_pass = action.substr(0, 5) == "slow:";
    const std::uint64_t bit = 1ULL << (index % 64);
    if (!every_pass && (fired.fetch_or(bit) & bit)) continue;
    if (action == "kill") ::raise(SIGKILL);
    if (action == "stop") ::raise(SIGSTOP);
    if (action == "fail") fail = true;
    if (action.substr(0, 6) == "pause:" || every_pass) {
      long ms = 0;
      for (char c : action.substr(action.find(':') + 1)) {
        if (c < '0' || c > '9') break;
        ms = ms * 10 + (c - '0');
      }
      timespec t{ms / 1000, (ms % 1000) * 1'000'000};
      while (::nanosleep(&t, &t) != 0) {
      }
    }
  }
  return fail;
}

}  // namespace vmmckpt
