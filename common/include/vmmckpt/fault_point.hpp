// Fault injection for the reliability tests: a named point where the tool can be made to die (SIGKILL).
#pragma once

#include <signal.h>

#include <cstdlib>
#include <cstring>

namespace vmmckpt {

// When VMMCKPT_TEST_KILL_AT names this point, the process kills itself here,
// as a crash or an OOM kill would, with no cleanup of any kind. Used by
// tests/emu/fault_e2e_test.cpp to prove that a tool dying at any phase never
// hurts the program and never leaves anything that passes verify.
inline void fault_point(const char* name) {
  static const char* wanted = std::getenv("VMMCKPT_TEST_KILL_AT");
  if (wanted != nullptr && std::strcmp(wanted, name) == 0) ::raise(SIGKILL);
}

}  // namespace vmmckpt
