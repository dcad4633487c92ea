// Load: a program allocating, freeing and keeping streams busy from many threads, while dumps and
// suspend/resume cycles run concurrently against it; invariants checked after every step.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

TEST_CASE("stress: concurrent dumps and suspend/resume cycles on a busy program", "[emu][stress]") {
  // VMMCKPT_STRESS_SECONDS lengthens the run (docs/reliability.md); CI uses the default.
  const char* env = std::getenv("VMMCKPT_STRESS_SECONDS");
  const int seconds = env ? std::atoi(env) : 15;
  scratch_dir dir;
  auto program = start_writer(seconds + 60);
  const std::string pid = std::to_string(program->pid());
  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);

  std::mutex failures_mutex;
  std::vector<std::string> failures;
  std::atomic<int> dumps{0}, cycles{0}, checks{0};
  auto fail = [&](std::string what) {
    std::lock_guard lock(failures_mutex);
    failures.push_back(std::move(what));
  };

  std::thread dumper([&] {
    for (int i = 0; std::chrono::steady_clock::now() < stop_at; ++i) {
      const fs::path out = dir.path / ("dump-" + std::to_string(i));
      const auto r = run_process({cuda_ckpt, "dump", pid, "-o", out.string()}, {}, 120);
      // A dump may meet the program suspended by the other thread: that refusal is correct.
      if (r.exit_code != 0) {
        if (r.err.find("suspended") == std::string::npos) fail("dump: " + describe(r));
        continue;
      }
      if (const std::string problem = untorn_problem(out); !problem.empty())
        fail("dump " + std::to_string(i) + ": " + problem);
      fs::remove_all(out);
      ++dumps;
    }
  });
  std::thread cycler([&] {
    for (int i = 0; std::chrono::steady_clock::now() < stop_at; ++i) {
      const fs::path out = dir.path / ("suspend-" + std::to_string(i));
      const auto s = run_process({cuda_ckpt, "suspend", pid, "-o", out.string()}, {}, 120);
      if (s.exit_code != 0) {
        fail("suspend: " + describe(s));
        continue;
      }
      const auto r = run_process({cuda_ckpt, "resume", pid}, {}, 120);
      if (r.exit_code != 0) fail("resume: " + describe(r));
      fs::remove_all(out);
      ++cycles;
    }
  });
  while (std::chrono::steady_clock::now() < stop_at) {
    const auto c = run_process({cuda_ckpt, "check", pid});
    if (c.exit_code != 0) fail("check: " + describe(c));
    ++checks;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  dumper.join();
  cycler.join();
  WARN("stress: " << seconds << " s, " << dumps << " dumps, " << cycles << " suspend/resume cycles, " << checks
                  << " consistency checks");
  for (const auto& f : failures) FAIL_CHECK(f);
  REQUIRE(failures.empty());
  REQUIRE(dumps > 0);
  REQUIRE(cycles > 0);
  REQUIRE(program->running());
  REQUIRE(run_process({cuda_ckpt, "check", pid}).exit_code == 0);
}
