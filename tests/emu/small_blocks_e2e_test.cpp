// End-to-end tests of many small allocations: packed into few extents, every byte back in its place after
// restore and resume, and the hold's allocation table listed beforehand only while it is still true.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string small_blocks = programs + "emu_small_blocks";
// The program's answer to SIGUSR2: every block read back against its pattern.
std::string check_blocks(background_process& program, std::size_t blocks) {
  const std::string expected = "check ok " + std::to_string(blocks) + "\n";
  ::kill(program.pid(), SIGUSR2);
  program.wait_for_output(expected, 60);
  const std::string& out = program.output();
  return out.find("check bad") != std::string::npos ? out.substr(out.find("check bad"))
                                                    : out.substr(out.rfind("check"));
}

// `cuda-ckpt dump` of the program into `image`, which must then read back whole.
vmmckpt::image::reader dump_and_verify(const background_process& program, const fs::path& image) {
  const auto dumped = run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", image.string()}, {}, 120);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  auto reader = vmmckpt::image::reader::open(image);
  reader.verify_data();
  return reader;
}

}  // namespace

TEST_CASE("many small blocks: few extents, and dump, restore, suspend and resume bring every byte back",
          "[emu][small]") {
  scratch_dir dir;
  constexpr std::size_t blocks = 3000;
  background_process program(
      {cuda_ckpt, "run", "--", small_blocks, "--count", std::to_string(blocks), "--size", "200"});
  REQUIRE(program.wait_for_output("ready\n"));

  const fs::path image = dir.path / "image";
  {
    const auto reader = dump_and_verify(program, image);
    REQUIRE(reader.info().pools.size() == 1);
    const auto& pool = reader.info().pools[0];
    REQUIRE(pool.allocations.size() == blocks);
    // 200-byte blocks 512 bytes apart: the gaps are copied along but not stored.
    CHECK(pool.extents.size() < 10);
    CHECK(reader.info().data_bytes == blocks * 200);
  }
  // A new process: each block where it was, with its bytes.
  const auto restored =
      run_process({cuda_ckpt, "restore", image.string(), "--", restored_check, image.string()}, {}, 120);
  INFO(describe(restored));
  REQUIRE(restored.exit_code == 0);
  REQUIRE(restored.out.find("restored 3000 allocations, 600000 bytes, all equal") != std::string::npos);

  // In place: the program itself finds every block's pattern after it gets its memory back.
  const fs::path suspended = dir.path / "suspended";
  const auto s = run_process({cuda_ckpt, "suspend", std::to_string(program.pid()), "-o", suspended.string()}, {}, 120);
  INFO(describe(s));
  REQUIRE(s.exit_code == 0);
  const auto r = run_process({cuda_ckpt, "resume", std::to_string(program.pid())}, {}, 120);
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  REQUIRE(check_blocks(program, blocks) == "check ok 3000\n");
}

TEST_CASE(
    "large allocations are never joined: each starts an extent of its own, whose blocks the GPU can hash in place",
    "[emu][small]") {
  scratch_dir dir;
  // Small blocks, then three of 2 MiB: the pool puts the large ones side by side, close enough to be joined
  // if size did not count.
  background_process program({cuda_ckpt, "run", "--", small_blocks, "--count", "50", "--size", "200", "--large", "3"});
  REQUIRE(program.wait_for_output("ready\n"));
  const auto reader = dump_and_verify(program, dir.path / "image");
  const auto& pool = reader.info().pools.at(0);
  std::size_t large = 0;
  for (const auto& a : pool.allocations) {
    if (a.size < vmmckpt::image::write_block_size) continue;
    ++large;
    INFO("allocation at " << std::hex << a.addr);
    bool starts_extent = false;
    for (const auto& e : pool.extents) starts_extent = starts_extent || (e.addr == a.addr && e.stored == e.size);
    CHECK(starts_extent);
  }
  CHECK(large == 3);
  CHECK(pool.extents.size() < 10);  // the 50 small blocks are still joined
}

TEST_CASE("the allocation table listed before a hold is sent only while it is still true", "[emu][small]") {
  scratch_dir dir;
  const fs::path log = dir.path / "program.log";
  background_process program({cuda_ckpt, "run", "--", small_blocks, "--count", "500", "--size", "200"},
                             {{"VMMCKPT_LOG_LEVEL", "info"}, {"VMMCKPT_LOG_FILE", log.string()}});
  REQUIRE(program.wait_for_output("ready\n"));
  auto held_lines = [&] {
    std::string lines, line;
    std::istringstream in(file_text(log));
    while (std::getline(in, line))
      if (line.find("control: held;") != std::string::npos) lines += line + "\n";
    return lines;
  };

  // Nothing changes between the tool's hello and its hold: the program sends the table it listed
  // while it ran.
  const fs::path first = dir.path / "first";
  auto dumped = run_process({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", first.string()}, {}, 120);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  CHECK(held_lines().find("listed beforehand, unchanged, taken") != std::string::npos);

  // A block allocated after the hello (the tool paused there): the prepared table is stale, and the
  // image holds the new block all the same.
  background_process tool({cuda_ckpt, "dump", std::to_string(program.pid()), "-o", (dir.path / "second").string()},
                          {{"VMMCKPT_TEST_FAULT", "connected=pause:2000"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(program.pid(), SIGUSR1);
  REQUIRE(program.wait_for_output("grown 0x"));
  REQUIRE(tool.wait() == 0);
  const std::string out = program.output();
  const std::string grown = out.substr(out.find("grown 0x") + 6);
  const std::uint64_t grown_addr = std::stoull(grown.substr(2, grown.find(' ') - 2), nullptr, 16);
  const auto reader = vmmckpt::image::reader::open(dir.path / "second");
  const auto& allocations = reader.info().pools.at(0).allocations;
  REQUIRE(allocations.size() == 501);
  bool found = false;
  for (const auto& a : allocations) found = found || (a.addr == grown_addr && a.size == 12345);
  CHECK(found);
  const std::string lines = held_lines();
  const std::string last = lines.substr(lines.rfind("control: held;"));
  CHECK(last.find("beforehand") == std::string::npos);
  CHECK(last.find("501 blocks listed") != std::string::npos);
}
