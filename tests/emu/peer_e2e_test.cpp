// End-to-end tests of copies between devices and peer access on pool memory (two emulated devices).
//
// The emulator refuses, as the driver does, a copy that touches VMM memory of a device another taking part
// cannot access, while cuMemAlloc'd memory copies across devices freely: natively every form here works.
#include <catch2/catch.hpp>
#include <cuda.h>
#include <signal.h>

#include <map>
#include <regex>
#include <string>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string peer_program = programs + "emu_peer_copies";
const std::map<std::string, std::string> two_gpus = {{"VMMCKPT_EMU_DEVICES", "2"}};

process_result under_shim(const std::vector<std::string>& args, std::map<std::string, std::string> env = two_gpus) {
  std::vector<std::string> argv{cuda_ckpt, "run", "--", peer_program};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, env);
}

process_result native(const std::vector<std::string>& args, std::map<std::string, std::string> env = two_gpus) {
  std::vector<std::string> argv{peer_program};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, env);
}

// The "name=code" lines of the codes mode, by name.
std::map<std::string, int> codes_of(const std::string& out) {
  std::map<std::string, int> codes;
  static const std::regex line(R"(^(\w+)=(-?\d+)$)");
  std::smatch m;
  std::string::size_type at = 0;
  while (at < out.size()) {
    const auto end = out.find('\n', at);
    const std::string l = out.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (std::regex_match(l, m, line)) codes[m[1]] = std::stoi(m[2]);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return codes;
}

}  // namespace

TEST_CASE("peer access: enabling and disabling answer under the shim what the driver answers", "[emu][peer]") {
  const auto without = native({"codes"});
  INFO(describe(without));
  REQUIRE(without.exit_code == 0);
  const auto with = under_shim({"codes"});
  INFO(describe(with));
  REQUIRE(with.exit_code == 0);
  const auto expected = codes_of(without.out);
  REQUIRE(expected.size() == 12);
  REQUIRE(codes_of(with.out) == expected);
  // What the emulator models the driver with (cuda.h): the comparison above is only as good as these.
  CHECK(expected.at("can_access_0_1") == 1);
  CHECK(expected.at("can_access_0_0") == 0);
  CHECK(expected.at("enable_flags") == CUDA_ERROR_INVALID_VALUE);
  CHECK(expected.at("enable_self") == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(expected.at("enable_null") == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(expected.at("disable_not_enabled") == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK(expected.at("enable") == CUDA_SUCCESS);
  CHECK(expected.at("enable_twice") == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  CHECK(expected.at("disable") == CUDA_SUCCESS);
  CHECK(expected.at("disable_twice") == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK(expected.at("enable_again") == CUDA_SUCCESS);
  CHECK(expected.at("enable_same_device") == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
}

TEST_CASE("every copy form between two devices works under the shim, with and without peer access", "[emu][peer]") {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"copies"}, {"copies", "--peer"}}) {
    INFO(args.back());
    const auto without = native(args);
    INFO(describe(without));
    REQUIRE(without.exit_code == 0);
    REQUIRE(without.out.find("copies ok") != std::string::npos);
    const auto with = under_shim(args);
    INFO(describe(with));
    REQUIRE(with.exit_code == 0);
    REQUIRE(with.out.find("copies ok") != std::string::npos);
  }
}

TEST_CASE("devices without peer-to-peer: pool memory does not copy across them (known limitation)", "[emu][peer]") {
  auto no_p2p = two_gpus;
  no_p2p["VMMCKPT_EMU_NO_P2P"] = "1";
  // Natively (cuMemAlloc'd memory) the driver copies across such devices.
  const auto without = native({"copies"}, no_p2p);
  INFO(describe(without));
  REQUIRE(without.exit_code == 0);
  // Under the shim the first cross-device copy fails cleanly, with the driver's error for VMM memory.
  const auto with = under_shim({"copies"}, no_p2p);
  INFO(describe(with));
  REQUIRE(with.exit_code == 3);
  REQUIRE(with.out.find("BAD cuMemcpy from device 0") != std::string::npos);
  REQUIRE(with.out.find("error " + std::to_string(CUDA_ERROR_INVALID_VALUE)) != std::string::npos);
}

TEST_CASE("peer access survives a dump and a suspend/resume, and the two-device image restores", "[emu][peer]") {
  scratch_dir dir;
  background_process program({cuda_ckpt, "run", "--", peer_program, "serve"}, two_gpus);
  REQUIRE(program.wait_for_output("ready\n"));
  std::smatch m;
  const std::string out = program.output();
  REQUIRE(std::regex_search(out, m, std::regex(R"(a0=(\d+) a1=(\d+))")));
  const std::string a0 = m[1], a1 = m[2];
  const std::string pid = std::to_string(program.pid());
  auto round = [&](int n) {
    REQUIRE(kill(program.pid(), SIGUSR1) == 0);
    const bool done = program.wait_for_output("round " + std::to_string(n) + " ok\n", 60);
    INFO(program.output());
    REQUIRE(done);
  };
  round(1);
  const fs::path image = dir.path / "image";
  const auto dumped = run_process({cuda_ckpt, "dump", pid, "-o", image.string()}, two_gpus);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  round(2);
  const auto suspended = run_process({cuda_ckpt, "suspend", pid, "-o", (dir.path / "suspend").string()}, two_gpus);
  INFO(describe(suspended));
  REQUIRE(suspended.exit_code == 0);
  const auto resumed = run_process({cuda_ckpt, "resume", pid}, two_gpus);
  INFO(describe(resumed));
  REQUIRE(resumed.exit_code == 0);
  // Segments mapped anew on resume carry the peer's access again: every cross-device form still works.
  round(3);
  // A new process from the image: its pointers hold their bytes and copy across devices, peer access or not.
  const auto restored =
      run_process({cuda_ckpt, "restore", image.string(), "--", peer_program, "restored", a0, a1}, two_gpus);
  INFO(describe(restored));
  REQUIRE(restored.exit_code == 0);
  REQUIRE(restored.out.find("restored ok") != std::string::npos);
}
