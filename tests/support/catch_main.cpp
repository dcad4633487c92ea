// The Catch2 main of every test executable: runs the session and turns "every test case skipped" into exit code 77.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <set>
#include <string>

#include "skip.hpp"

namespace {

// Test cases started and skipped in this process, by name (a test case with sections starts once per
// section run, hence sets).
std::set<std::string> started, skipped;
std::string current;

struct skip_listener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    current = info.name;
    started.insert(info.name);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(skip_listener)

namespace vmmckpt::test {

void note_skip(const std::string& reason) {
  skipped.insert(current);
  std::printf("SKIPPED: %s: %s\n", current.c_str(), reason.c_str());
  std::fflush(stdout);
}

}  // namespace vmmckpt::test

int main(int argc, char** argv) {
  const int result = Catch::Session().run(argc, argv);
  if (result != 0 || skipped.empty()) return result;
  if (skipped == started) return 77;  // ctest's SKIP_RETURN_CODE: nothing ran but skips
  std::printf("%zu of %zu test cases skipped (see SKIPPED lines above)\n", skipped.size(), started.size());
  return result;
}
