// Fault injection: the tool killed (SIGKILL) at every phase of dump, suspend and resume.
//
// After each kill the program must be unharmed (running, or safely suspended
// and resumable), its pool consistent, and nothing left behind may pass verify.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

nlohmann::json state_of(pid_t pid) {
  const auto ps = run_process({cuda_ckpt, "ps", "--json"});
  for (const auto& p : nlohmann::json::parse(ps.out))
    if (p.at("pid").get<pid_t>() == pid) return p;
  FAIL("process " << pid << " is not listed by ps");
  return {};
}

void require_consistent(pid_t pid) {
  const auto r = run_process({cuda_ckpt, "check", std::to_string(pid)});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
}

// Nothing under `out`'s name, finished or partial, passes verify.
void require_no_valid_leftover(const fs::path& out) {
  REQUIRE_FALSE(fs::exists(fs::symlink_status(out)));
  for (const auto& entry : fs::directory_iterator(out.parent_path())) {
    if (entry.path().filename().string().rfind(out.filename().string(), 0) != 0) continue;
    const auto r = run_process({cuda_ckpt, "verify", entry.path().string()});
    INFO(entry.path());
    REQUIRE(r.exit_code == 1);
  }
}

process_result killed_at(const std::string& phase, const std::vector<std::string>& argv) {
  const auto r = run_process(argv, {{"VMMCKPT_TEST_FAULT", phase}}, 120);
  INFO(describe(r));
  REQUIRE(r.signal == SIGKILL);  // it really died at that point
  usleep(100'000);               // the program notices the closed connection
  return r;
}

}  // namespace

TEST_CASE("dump: the tool killed at each phase leaves the program running and nothing valid", "[emu][fault]") {
  scratch_dir dir;
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  for (const std::string phase : {"connected", "held", "copying", "writing", "renaming"}) {
    DYNAMIC_SECTION("killed at " << phase) {
      const fs::path out = dir.path / ("image-" + phase);
      killed_at(phase, {cuda_ckpt, "dump", pid, "-o", out.string()});
      REQUIRE(program->running());
      REQUIRE(state_of(program->pid()).at("state") == "running");
      require_consistent(program->pid());
      require_no_valid_leftover(out);
      // And the program can be dumped again at once: the gate is open.
      const fs::path again = dir.path / ("again-" + phase);
      REQUIRE(run_process({cuda_ckpt, "dump", pid, "-o", again.string()}).exit_code == 0);
      require_untorn(again);
    }
  }
}

TEST_CASE("suspend: the tool killed at each phase leaves the program running, or suspended and resumable",
          "[emu][fault]") {
  scratch_dir dir;
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  for (const std::string phase : {"connected", "held", "copying", "writing", "renaming", "verified", "suspended"}) {
    DYNAMIC_SECTION("killed at " << phase) {
      const fs::path out = dir.path / ("suspend-" + phase);
      killed_at(phase, {cuda_ckpt, "suspend", pid, "-o", out.string()});
      REQUIRE(program->running());
      const auto state = state_of(program->pid());
      if (phase == "suspended") {
        // The process gave its memory back before the tool died: it waits, safely, for resume.
        REQUIRE(state.at("state") == "suspended");
        REQUIRE(state.at("pools").at(0).at("backed_bytes").get<std::uint64_t>() == 0);
        REQUIRE(run_process({cuda_ckpt, "resume", pid}).exit_code == 0);
      } else {
        // Nothing was freed: the image was not complete and verified.
        REQUIRE(state.at("state") == "running");
        REQUIRE(state.at("pools").at(0).at("backed_bytes").get<std::uint64_t>() > 0);
        if (phase != "verified") require_no_valid_leftover(out);
      }
      require_consistent(program->pid());
      const fs::path again = dir.path / ("again-" + phase);
      REQUIRE(run_process({cuda_ckpt, "dump", pid, "-o", again.string()}).exit_code == 0);
      require_untorn(again);
    }
  }
}

TEST_CASE("resume: the tool killed after asking leaves the program resumed", "[emu][fault]") {
  scratch_dir dir;
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  REQUIRE(run_process({cuda_ckpt, "suspend", pid, "-o", (dir.path / "image").string()}).exit_code == 0);
  killed_at("requested:resume", {cuda_ckpt, "resume", pid});
  // The program finishes the resume on its own; it does not need the tool for it.
  for (int i = 0; i < 50 && state_of(program->pid()).at("state") != "running"; ++i) usleep(100'000);
  REQUIRE(state_of(program->pid()).at("state") == "running");
  require_consistent(program->pid());
  const fs::path after = dir.path / "after";
  REQUIRE(run_process({cuda_ckpt, "dump", pid, "-o", after.string()}).exit_code == 0);
  require_untorn(after);
}
