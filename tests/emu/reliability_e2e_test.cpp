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

TEST_CASE("cuda-ckpt ignores SIGXFSZ for itself, not for the command it runs", "[emu][reliability]") {
  // SIGXFSZ is signal 25: bit 24 of the SigIgn mask in /proc/PID/status.
  const auto r = run_process({"sh", "-c", "trap - XFSZ; exec '" + cuda_ckpt +
                                              "' run -- sh -c 'grep SigIgn /proc/self/status'"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  const auto at = r.out.find("SigIgn:");
  REQUIRE(at != std::string::npos);
  const std::uint64_t ignored = std::stoull(r.out.substr(at + 7), nullptr, 16);
  REQUIRE((ignored & (1ULL << 24)) == 0);
}
