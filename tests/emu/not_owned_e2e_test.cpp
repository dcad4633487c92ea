// End-to-end tests of memory the shim does not own: dump and suspend refuse it by default, --allow-partial writes a partial image.
#include <catch2/catch.hpp>

#include <signal.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string not_owned_program = programs + "emu_not_owned";

std::unique_ptr<background_process> start_not_owned(std::vector<std::string> kinds = {}) {
  std::vector<std::string> argv{cuda_ckpt, "run", "--", not_owned_program};
  argv.insert(argv.end(), kinds.begin(), kinds.end());
  auto p = std::make_unique<background_process>(argv);
  REQUIRE(p->wait_for_output("ready\n"));
  return p;
}

process_result run_tool(const std::vector<std::string>& args) {
  std::vector<std::string> argv{cuda_ckpt};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, 120);
}

// Nothing named like the image, finished or unfinished (NAME.partial-...), in its directory.
void require_no_image(const fs::path& out) {
  REQUIRE_FALSE(fs::exists(fs::symlink_status(out)));
  for (const auto& entry : fs::directory_iterator(out.parent_path()))
    REQUIRE(entry.path().filename().string().rfind(out.filename().string(), 0) != 0);
}

// The program checks its pool memory's pattern and ends: it must say "intact" and exit 0.
void require_intact(background_process& program) {
  REQUIRE(::kill(program.pid(), SIGUSR2) == 0);
  REQUIRE(program.wait_for_output("intact\n"));
  REQUIRE(program.wait() == 0);
}

// ps --json's not_owned list of the process, as {kind: bytes}.
std::map<std::string, std::uint64_t> listed_not_owned(pid_t pid) {
  const nlohmann::json entry = listed_state(pid);
  REQUIRE_FALSE(entry.is_null());
  std::map<std::string, std::uint64_t> out;
  for (const auto& m : entry.at("not_owned")) out[m.at("kind").get<std::string>()] = m.at("bytes").get<std::uint64_t>();
  return out;
}

const std::map<std::string, std::uint64_t> all_three = {
    {"managed", 64u << 20}, {"arrays", 1u << 20}, {"memory pools", 2u << 20}};

}  // namespace

TEST_CASE("not owned: ps counts each kind; dump refuses naming them, leaves nothing, and the program goes on",
          "[emu][not-owned]") {
  scratch_dir dir;
  auto program = start_not_owned();
  REQUIRE(listed_not_owned(program->pid()) == all_three);
  const auto human_ps = run_tool({"ps"});
  REQUIRE(human_ps.out.find("NOT OWNED") != std::string::npos);
  REQUIRE(human_ps.out.find("not owned: managed 64.00 MiB, arrays 1.00 MiB, memory pools 2.00 MiB") !=
          std::string::npos);

  const fs::path out = dir.path / "image";
  const auto refused = run_tool({"dump", std::to_string(program->pid()), "-o", out.string()});
  INFO(describe(refused));
  REQUIRE(refused.exit_code == 3);
  REQUIRE(refused.err.find("managed 64.00 MiB, arrays 1.00 MiB, memory pools 2.00 MiB") != std::string::npos);
  REQUIRE(refused.err.find("Pass --allow-partial to write an image marked partial") != std::string::npos);
  require_no_image(out);
  REQUIRE(program->running());
  // Released, not held: the program still answers, and a suspend is refused the same way.
  const auto suspend_refused = run_tool({"suspend", std::to_string(program->pid()), "-o", (dir.path / "s").string()});
  INFO(describe(suspend_refused));
  REQUIRE(suspend_refused.exit_code == 3);
  REQUIRE(suspend_refused.err.find("managed 64.00 MiB") != std::string::npos);
  require_no_image(dir.path / "s");
  REQUIRE(listed_state(program->pid()).at("state") == "running");
  require_intact(*program);
}

TEST_CASE("not owned: dump --allow-partial writes an image that says what it lacks, everywhere it is read",
          "[emu][not-owned]") {
  scratch_dir dir;
  auto program = start_not_owned({"managed"});
  const fs::path out = dir.path / "image";
  const auto dumped =
      run_tool({"dump", std::to_string(program->pid()), "-o", out.string(), "--allow-partial", "--json"});
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  REQUIRE(nlohmann::json::parse(dumped.out).at("lacking") ==
          nlohmann::json::parse(R"([{"kind": "managed", "bytes": 67108864}])"));

  const auto inspect = run_tool({"inspect", out.string()});
  INFO(describe(inspect));
  REQUIRE(inspect.out.find("partial: lacks managed 64.00 MiB") != std::string::npos);
  const auto inspect_json = nlohmann::json::parse(run_tool({"inspect", "--json", out.string()}).out);
  REQUIRE(inspect_json.at("lacking").at(0).at("kind") == "managed");
  REQUIRE(inspect_json.at("lacking").at(0).at("bytes") == 64u << 20);

  const auto verify = run_tool({"verify", out.string()});
  INFO(describe(verify));
  REQUIRE(verify.exit_code == 0);
  REQUIRE(verify.out.find("partial: lacks managed 64.00 MiB") != std::string::npos);
  const auto verify_json = nlohmann::json::parse(run_tool({"verify", "--json", out.string()}).out);
  REQUIRE(verify_json.at("ok") == true);
  REQUIRE(verify_json.at("partial") == true);

  // The warning comes before the command starts (which here touches no CUDA at all).
  const auto restored = run_tool({"restore", out.string(), "--", "true"});
  INFO(describe(restored));
  REQUIRE(restored.exit_code == 0);
  REQUIRE(restored.err.find("warning: " + out.string() + " is a partial image: it lacks managed 64.00 MiB") !=
          std::string::npos);
  require_intact(*program);
}

TEST_CASE("not owned: suspend --allow-partial frees the pool memory and resume brings it back; the rest stays",
          "[emu][not-owned]") {
  scratch_dir dir;
  auto program = start_not_owned({"array", "pool"});
  const fs::path out = dir.path / "suspended";
  const auto suspended = run_tool({"suspend", std::to_string(program->pid()), "-o", out.string(), "--allow-partial"});
  INFO(describe(suspended));
  REQUIRE(suspended.exit_code == 0);
  REQUIRE(suspended.out.find("memory vmmckpt does not own stays on the GPU, and the image lacks it: arrays 1.00 MiB, "
                             "memory pools 2.00 MiB") != std::string::npos);
  REQUIRE(listed_state(program->pid()).at("state") == "suspended");
  // Still live while suspended: it never left the GPU.
  REQUIRE(listed_not_owned(program->pid()) ==
          std::map<std::string, std::uint64_t>{{"arrays", 1u << 20}, {"memory pools", 2u << 20}});
  const auto resumed = run_tool({"resume", std::to_string(program->pid())});
  INFO(describe(resumed));
  REQUIRE(resumed.exit_code == 0);
  require_intact(*program);
}

TEST_CASE("not owned: once the program frees that memory the count is zero and a plain dump succeeds",
          "[emu][not-owned]") {
  scratch_dir dir;
  auto program = start_not_owned();
  REQUIRE(listed_not_owned(program->pid()) == all_three);
  REQUIRE(::kill(program->pid(), SIGUSR1) == 0);
  REQUIRE(program->wait_for_output("freed\n"));
  REQUIRE(listed_not_owned(program->pid()).empty());
  const fs::path out = dir.path / "image";
  const auto dumped = run_tool({"dump", std::to_string(program->pid()), "-o", out.string(), "--json"});
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  REQUIRE(nlohmann::json::parse(dumped.out).at("lacking").empty());
  REQUIRE(vmmckpt::image::reader::open(out).info().lacking.empty());
  require_intact(*program);
}
