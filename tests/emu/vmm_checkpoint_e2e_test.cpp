// End-to-end tests of program-made VMM memory in checkpoints: dumped, restored into a new process,
// suspended and resumed, with the program checking its own bytes, addresses and handle tokens.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <thread>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string vmm_program = programs + "emu_vmm_checkpointed";
constexpr std::uint64_t mib = 1 << 20;

// Asks the program in `dir` to do `what` (check, mutate, finish) and waits for its answer.
void ask(background_process& p, const fs::path& dir, const std::string& what, const std::string& answer) {
  std::ofstream(dir / what).put('\n');
  INFO(p.output());
  REQUIRE(p.wait_for_output(answer));
}

nlohmann::json run_json(const std::vector<std::string>& argv) {
  const auto r = run_process(argv);
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

// Where a byte of an image's program-made VMM memory lies: the data file and offset of byte `at` of the
// stored bytes of the first (or last) extent of its pools of kind vmm.
struct file_byte {
  fs::path file;
  std::uint64_t offset = 0;
};
file_byte vmm_byte(const fs::path& image, bool last, std::uint64_t at) {
  const auto inspected = run_json({cuda_ckpt, "inspect", image.string(), "--json"});
  nlohmann::json extent;
  for (const auto& p : inspected.at("pools"))
    if (p.value("kind", "pool") == "vmm" && (last || extent.is_null()))
      extent = last ? p.at("extents").back() : p.at("extents").at(0);
  REQUIRE(extent.is_object());
  const std::uint32_t file = extent.at("file");
  return {image / (file == 0 ? std::string("data.bin") : "data." + std::to_string(file) + ".bin"),
          64 + extent.at("offset").get<std::uint64_t>() + at};  // past the data file's 64-byte header
}

}  // namespace

TEST_CASE("a dump holds program-made VMM memory; a new process restored from it finds its bytes, addresses and tokens",
          "[emu][vmm][vmm_checkpoint]") {
  scratch_dir dir;
  background_process program({cuda_ckpt, "run", "--", vmm_program, dir.path.string()});
  REQUIRE(program.wait_for_output("ready\n"));
  const fs::path image = dir.path / "image";
  const auto dumped = run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", image.string()});
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  ask(program, dir.path, "check", "ok 1\n");  // the dump harmed nothing

  // The image: both reservations (one never mapped), five handles, five mappings, all their bytes.
  const auto inspected = run_json({cuda_ckpt, "inspect", image.string(), "--json"});
  REQUIRE(inspected.at("format") == 6);
  const auto& vmm = inspected.at("vmm");
  CHECK(vmm.at("reservations").size() == 2);
  CHECK(vmm.at("handles").size() == 5);
  CHECK(vmm.at("mappings").size() == 5);
  CHECK(vmm.at("handles")[0].at("refs") == 2);  // the retain on an interior address
  CHECK(vmm.at("mappings")[4].at("size") == 16 * mib);
  CHECK(inspected.at("data_bytes") == 48 * mib + mib);
  const auto verified = run_process({cuda_ckpt, "verify", image.string()});
  INFO(describe(verified));
  CHECK(verified.exit_code == 0);

  // The program ends; a new one restored from the image checks everything, then uses and frees it all.
  ask(program, dir.path, "finish", "done\n");
  REQUIRE(program.wait() == 0);
  background_process restored(
      {cuda_ckpt, "restore", image.string(), "--", vmm_program, dir.path.string(), "--restored"});
  INFO(restored.output());
  REQUIRE(restored.wait_for_output("restored\n"));
  ask(restored, dir.path, "check", "ok 1\n");
  ask(restored, dir.path, "mutate", "mutated 1\n");
  ask(restored, dir.path, "check", "ok 2\n");
  ask(restored, dir.path, "finish", "done\n");
  REQUIRE(restored.wait() == 0);
  // The counter goes on from the image's: the next handle is the seventh token.
  CHECK_THAT(restored.output(), Catch::Contains("token 0x766d6d0000000007"));
}

TEST_CASE("suspend frees program-made VMM memory; resume brings it back under the same pointers and tokens",
          "[emu][vmm][suspend][vmm_checkpoint]") {
  scratch_dir dir;
  background_process program({cuda_ckpt, "run", "--", vmm_program, dir.path.string()});
  REQUIRE(program.wait_for_output("ready\n"));
  const std::string pid = std::to_string(program.pid());
  for (int cycle = 1; cycle <= 3; ++cycle) {
    INFO("cycle " << cycle);
    const fs::path image = dir.path / ("suspend-" + std::to_string(cycle));
    const auto suspended = run_json({cuda_ckpt, "suspend", pid, "-o", image.string(), "--json"});
    // The five handles' 48 MiB, and the pool's memory, are given back.
    CHECK(suspended.at("freed_bytes").get<std::uint64_t>() >= 48 * mib + mib);
    CHECK(suspended.at("bytes") == 48 * mib + mib);
    const auto resumed = run_process({cuda_ckpt, "resume", pid});
    INFO(describe(resumed));
    REQUIRE(resumed.exit_code == 0);
    ask(program, dir.path, "check", "ok " + std::to_string(cycle) + "\n");
    ask(program, dir.path, "mutate", "mutated " + std::to_string(cycle) + "\n");
  }
  ask(program, dir.path, "finish", "done\n");
  REQUIRE(program.wait() == 0);
}

TEST_CASE("a --replay restore gives program-made VMM memory its bytes back as the program makes it again",
          "[emu][vmm][vmm_checkpoint]") {
  scratch_dir dir;
  const fs::path image = dir.path / "image";
  {
    background_process program({cuda_ckpt, "run", "--", vmm_program, dir.path.string()});
    REQUIRE(program.wait_for_output("ready\n"));
    ask(program, dir.path, "mutate", "mutated 1\n");  // bytes the replayed run never writes
    const auto dumped = run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", image.string()});
    INFO(describe(dumped));
    REQUIRE(dumped.exit_code == 0);
  }
  background_process replayed(
      {cuda_ckpt, "restore", image.string(), "--replay", "--", vmm_program, dir.path.string(), "--replayed"});
  INFO(replayed.output());
  REQUIRE(replayed.wait_for_output("replayed\n"));
  ask(replayed, dir.path, "check", "ok 1\n");
  ask(replayed, dir.path, "finish", "done\n");
  REQUIRE(replayed.wait() == 0);
}

TEST_CASE("restore --device moves program-made VMM memory to another GPU at the same addresses and tokens",
          "[emu][vmm][vmm_checkpoint][two_gpus]") {
  const std::map<std::string, std::string> two_gpus = {{"VMMCKPT_EMU_DEVICES", "2"}};
  scratch_dir dir;
  const fs::path image = dir.path / "image";
  {
    background_process program({cuda_ckpt, "run", "--", vmm_program, dir.path.string()}, two_gpus);
    REQUIRE(program.wait_for_output("ready\n"));
    const auto dumped = run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", image.string()}, two_gpus);
    INFO(describe(dumped));
    REQUIRE(dumped.exit_code == 0);
  }
  background_process moved(
      {cuda_ckpt, "restore", image.string(), "--device", "1", "--", vmm_program, dir.path.string(), "--restored"},
      two_gpus);
  INFO(moved.output());
  REQUIRE(moved.wait_for_output("restored\n"));
  ask(moved, dir.path, "check", "ok 1\n");
  ask(moved, dir.path, "finish", "done\n");
  REQUIRE(moved.wait() == 0);
}

TEST_CASE("a VMM handle mapped nowhere makes dump refuse, naming it, unless --allow-partial", "[emu][vmm]") {
  scratch_dir dir;
  background_process program({cuda_ckpt, "run", "--", vmm_program, dir.path.string()});
  REQUIRE(program.wait_for_output("ready\n"));
  ask(program, dir.path, "orphan", "orphaned\n");
  const fs::path image = dir.path / "image";
  const auto refused = run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", image.string()});
  INFO(describe(refused));
  CHECK(refused.exit_code == 3);
  CHECK_THAT(refused.err, Catch::Contains("VMM handles mapped nowhere 2.00 MiB"));
  CHECK_FALSE(fs::exists(image));
  ask(program, dir.path, "check", "ok 1\n");  // the refusal harmed nothing
  const auto partial =
      run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", image.string(), "--allow-partial"});
  INFO(describe(partial));
  REQUIRE(partial.exit_code == 0);
  const auto inspected = run_json({cuda_ckpt, "inspect", image.string(), "--json"});
  REQUIRE(inspected.at("lacking").size() == 1);
  CHECK(inspected.at("lacking")[0].at("kind") == "VMM handles mapped nowhere");
  CHECK(inspected.at("lacking")[0].at("bytes") == 2 * mib);
  CHECK(inspected.at("vmm").at("handles").size() == 6);
  ask(program, dir.path, "finish", "done\n");
  REQUIRE(program.wait() == 0);
}

TEST_CASE("a resume whose VMM bytes are damaged fails, the program stays suspended, and a retry works",
          "[emu][vmm][suspend]") {
  scratch_dir dir;
  background_process program({cuda_ckpt, "run", "--", vmm_program, dir.path.string()});
  REQUIRE(program.wait_for_output("ready\n"));
  const std::string pid = std::to_string(program.pid());
  const fs::path image = dir.path / "image";
  REQUIRE(run_process({cuda_ckpt, "suspend", pid, "-o", image.string()}).exit_code == 0);
  // One byte of the first VMM mapping's stored bytes, wherever the dump put them.
  const file_byte damaged = vmm_byte(image, false, 4096);
  flip_byte(damaged.file, damaged.offset);
  const auto bad = run_process({cuda_ckpt, "resume", pid});
  INFO(describe(bad));
  REQUIRE(bad.exit_code == 1);
  CHECK_THAT(bad.err, Catch::Contains("checksum mismatch"));
  CHECK_THAT(bad.err, Catch::Contains("stays suspended"));
  REQUIRE(program.running());
  flip_byte(damaged.file, damaged.offset);  // repaired
  const auto good = run_process({cuda_ckpt, "resume", pid});
  INFO(describe(good));
  REQUIRE(good.exit_code == 0);
  ask(program, dir.path, "check", "ok 1\n");
  ask(program, dir.path, "finish", "done\n");
  REQUIRE(program.wait() == 0);
}

TEST_CASE("a --replay restore of damaged VMM bytes fails before the program uses any memory", "[emu][vmm]") {
  scratch_dir dir;
  const fs::path image = dir.path / "image";
  {
    background_process program({cuda_ckpt, "run", "--", vmm_program, dir.path.string()});
    REQUIRE(program.wait_for_output("ready\n"));
    REQUIRE(run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", image.string()}).exit_code == 0);
  }
  const file_byte damaged = vmm_byte(image, true, 100);
  flip_byte(damaged.file, damaged.offset);
  const auto replayed = run_process(
      {cuda_ckpt, "restore", image.string(), "--replay", "--", vmm_program, dir.path.string(), "--replayed"});
  INFO(describe(replayed));
  CHECK(replayed.exit_code != 0);
  CHECK_THAT(replayed.err, Catch::Contains("checksum mismatch"));
  CHECK_THAT(replayed.out, !Catch::Contains("replayed"));
}
