// Skipping a Catch2 test case so that ctest reports it as skipped (exit code 77, SKIP_RETURN_CODE), with the reason.
#pragma once

#include <string>

namespace vmmckpt::test {

// Records that the running test case is skipped, and prints "SKIPPED: <test>: <reason>". Catch2 v2 has
// no skip of its own: the test case returns right after (VMMCKPT_SKIP does both), and the shared main
// (catch_main.cpp) exits 77 when every test case it ran was skipped, which is what ctest, running one
// test case per process, reports as skipped. A run of many test cases still passes, naming the skips.
void note_skip(const std::string& reason);

}  // namespace vmmckpt::test

// Only in a test case's own body, outside any SECTION: a skip covers a whole test case.
#define VMMCKPT_SKIP(reason)            \
  do {                                  \
    ::vmmckpt::test::note_skip(reason); \
    return;                             \
  } while (0)
