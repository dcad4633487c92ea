// A whole-process checkpoint by a user who is not root: CRIU needs root or its capabilities, so without either the
// tool refuses before it touches anything (issue 54): the program is not suspended, not stopped, and no image is
// left, where an earlier cuda-ckpt suspended the program first and only then failed.
#include <sys/stat.h>

#include "process_support.hpp"

namespace vmmckpt::test {
namespace {

constexpr uid_t nobody = 65534;

std::vector<std::string> as_nobody(std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
  return argv;
}

TEST_CASE("dump --process by a user who is neither root nor CRIU-capable is refused before anything is touched",
          "[emu][process]") {
  REQUIRE_CRIU();  // root, to become another user here, and a CRIU 4 that user may run
  if (::access("/usr/bin/setpriv", X_OK) != 0) VMMCKPT_SKIP("no setpriv (util-linux) to run as another user");
  scratch_dir dir;
  REQUIRE(::chown(dir.path.c_str(), nobody, nobody) == 0);
  const std::map<std::string, std::string> env = {{"XDG_RUNTIME_DIR", dir.path.string()}};
  background_process program(as_nobody({cuda_ckpt, "run", "--", writer_program, "--seconds", "60"}), env);
  REQUIRE(program.wait_for_output("ready\n"));
  const std::string pid = std::to_string(program.pid());
  const fs::path image = dir.path / "image";

  const auto refused = run_process(as_nobody({cuda_ckpt, "dump", pid, "--process", "-o", image.string()}), env);
  INFO(describe(refused));
  CHECK(refused.exit_code == 1);
  CHECK(refused.err.find("needs root, or CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE") != std::string::npos);
  CHECK(refused.err.find("nothing was touched") != std::string::npos);
  CHECK_FALSE(fs::exists(image));
  CHECK(proc_state(program.pid()) != 'T');
  const auto ps = run_process(as_nobody({cuda_ckpt, "ps", pid, "--json"}), env);
  INFO(describe(ps));
  REQUIRE(ps.exit_code == 0);
  CHECK(nlohmann::json::parse(ps.out).at(0).at("state") == "running");
  // What needs no privilege still works for that user.
  const auto dumped = run_process(as_nobody({cuda_ckpt, "dump", pid, "-o", image.string()}), env, 120);
  INFO(describe(dumped));
  CHECK(dumped.exit_code == 0);
}

}  // namespace
}  // namespace vmmckpt::test
