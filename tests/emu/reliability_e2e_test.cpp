// The reliability defects, one test each, that failed before their fix: fork children, file-size
// limits, deadlines, slow clients, images verify refuses, resume's identity check.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string programs = build_dir + "/tests/programs/";

}  // namespace

TEST_CASE("a fork child that exits through exit() leaves its parent's control socket alone", "[emu][reliability]") {
  background_process program({cuda_ckpt, "run", "--", programs + "emu_fork_alloc", "child-exits"});
  REQUIRE(program.wait_for_output("ready\n"));
  const auto r = run_process({cuda_ckpt, "check", std::to_string(program.pid())});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
}
