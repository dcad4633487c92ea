// End-to-end tests of a multi-rank NCCL job on the stand-in libnccl.so.2 (tests/programs/emu/collective_job.cpp,
// collective_rank.cpp, fake_nccl.cpp): under the shim it ends with the results of a run without it, and each of its
// ranks can be dumped on its own while the others go on; and the stand-in's waits are real: a rank held back holds
// the others.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "collective_job_output.hpp"
#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

// The rank's pid from its `pid RANK PID` line.
pid_t pid_of_rank(const std::string& out, int rank) {
  const std::string marker = "pid " + std::to_string(rank) + " ";
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(marker, 0) == 0) return static_cast<pid_t>(std::stol(line.substr(marker.size())));
  return -1;
}

std::vector<std::string> job_command(const fs::path& dir, int nranks, int steps, int step_ms) {
  return {job_program,           dir.string(), std::to_string(nranks),
          std::to_string(steps), "--step-ms",  std::to_string(step_ms)};
}

// The job run without the shim, uninterrupted: the results every other run of it must end with.
std::map<int, std::string> reference_run(const fs::path& dir, int nranks, int steps) {
  const auto plain = run_process(job_command(dir, nranks, steps, 0), {{"LD_PRELOAD", ""}}, 120);
  INFO(describe(plain));
  REQUIRE(plain.exit_code == 0);
  const auto done = done_lines(plain.out);
  REQUIRE(done.size() == static_cast<std::size_t>(nranks));
  return done;
}

// The last step each rank finished (its DIR/RANK.step).
std::vector<int> steps_done(const fs::path& dir, int nranks) {
  std::vector<int> steps;
  for (int r = 0; r < nranks; ++r) {
    int step = -1;
    std::ifstream(dir / (std::to_string(r) + ".step")) >> step;
    steps.push_back(step);
  }
  return steps;
}

// Waits for the job to end, at most `seconds`; its exit code, or -1 when it is still running.
int wait_for_end(background_process& job, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (job.running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return job.running() ? -1 : job.wait();
}

}  // namespace

TEST_CASE("a collective job runs to the end under the shim, and its results are those of a run without it",
          "[emu][collective]") {
  scratch_dir dir;
  const auto expected = reference_run(dir.path / "plain", 3, 40);
  // Two devices: ranks 0 and 2 on device 0, rank 1 on device 1; the results do not depend on it.
  const auto shimmed = run_process({cuda_ckpt, "run", "--", job_program, (dir.path / "shim").string(), "3", "40"},
                                   {{"VMMCKPT_EMU_DEVICES", "2"}}, 120);
  INFO(describe(shimmed));
  REQUIRE(shimmed.exit_code == 0);
  CHECK(done_lines(shimmed.out) == expected);
}

TEST_CASE("each rank of a running collective job can be dumped on its own", "[emu][collective]") {
  constexpr int nranks = 3, steps = 250;
  scratch_dir dir;
  const auto expected = reference_run(dir.path / "plain", nranks, steps);
  background_process job({cuda_ckpt, "run", "--", job_program, (dir.path / "job").string(), std::to_string(nranks),
                          std::to_string(steps), "--step-ms", "20"},
                         {{"VMMCKPT_EMU_DEVICES", "2"}});
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    INFO(job.output());
    REQUIRE(job.wait_for_output("step " + std::to_string(r) + " 10\n", 60));
    pids.push_back(pid_of_rank(job.output(), r));
    REQUIRE(pids.back() > 0);
  }
  for (int r = 0; r < nranks; ++r) {
    const fs::path image = dir.path / ("image-" + std::to_string(r));
    // cuda-ckpt must see the devices the rank sees.
    const auto dumped =
        run_process({cuda_ckpt, "dump", std::to_string(pids[r]), "-o", image.string()}, {{"VMMCKPT_EMU_DEVICES", "2"}});
    INFO("rank " << r << ": " << describe(dumped));
    REQUIRE(dumped.exit_code == 0);  // no --allow-partial: the peers' buffers are recorded as imports
    // Each communicator (the world and its split, all three ranks in both) maps both buffers of both peers.
    const auto inspected = run_process({cuda_ckpt, "inspect", image.string(), "--json"});
    INFO(describe(inspected));
    REQUIRE(inspected.exit_code == 0);
    const auto imports = nlohmann::json::parse(inspected.out).at("vmm").at("imports");
    CHECK(imports.size() == 8);
    for (const auto& x : imports) {
      const pid_t exporter = x.at("exporter_pid").get<pid_t>();
      CHECK(exporter != pids[r]);
      CHECK(std::find(pids.begin(), pids.end(), exporter) != pids.end());
    }
  }
  // The dumps were of a running job, and it went on.
  CHECK(job.running());
  CHECK(done_lines(job.output()).empty());
  const int code = wait_for_end(job, 120);
  INFO(job.output());
  REQUIRE(code == 0);
  CHECK(done_lines(job.output()) == expected);
}

TEST_CASE("a rank held back holds the other ranks of a collective job at its step, and they go on with it",
          "[emu][collective]") {
  constexpr int nranks = 3;
  scratch_dir dir;
  const fs::path job_dir = dir.path / "job";
  background_process job(job_command(job_dir, nranks, 150, 10), {{"LD_PRELOAD", ""}});
  REQUIRE(job.wait_for_output("step 1 10\n", 60));
  const pid_t held = pid_of_rank(job.output(), 1);
  REQUIRE(held > 0);
  REQUIRE(kill(held, SIGSTOP) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the others run into the first step that needs it
  const auto before = steps_done(job_dir, nranks);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto after = steps_done(job_dir, nranks);
  kill(held, SIGCONT);
  CHECK(after == before);
  // Rank 1 may have taken its part in the step after the one it wrote down, not in the one after that.
  CHECK(after[0] <= after[1] + 1);
  CHECK(after[2] <= after[1] + 1);
  CHECK(after[1] < 150);
  const int code = wait_for_end(job, 60);
  INFO(job.output());
  REQUIRE(code == 0);
  CHECK(done_lines(job.output()).size() == nranks);
}
