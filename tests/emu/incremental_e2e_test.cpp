// End-to-end tests of incremental images: dump --parent, the chain followed by verify, restore and resume, its refusals, merge and rm.
#include <catch2/catch.hpp>

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string program = programs + "emu_incremental";
constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t live_bytes = 100 * MiB;  // emu_incremental's 4 x 25 MiB

nlohmann::json dump_json(pid_t pid, const fs::path& out, const fs::path& parent = {}, bool cpu_checksums = false,
                         const std::vector<std::string>& more = {}) {
  std::vector<std::string> argv{cuda_ckpt, "dump", std::to_string(pid), "-o", out.string(), "--json"};
  if (cpu_checksums) argv.push_back("--cpu-checksums");
  if (!parent.empty()) argv.insert(argv.end(), {"--parent", parent.string()});
  argv.insert(argv.end(), more.begin(), more.end());
  const auto r = run_process(argv);
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

// The restored program finds exactly the bytes the live one had when it saved `live`.
void check_restore(const fs::path& image, const fs::path& live) {
  const auto r = run_process({cuda_ckpt, "restore", image.string(), "--", program, "check", live.string()});
  INFO(describe(r));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("equal: " + std::to_string(live_bytes) + " bytes"));
}

struct chain {
  scratch_dir dir;
  std::unique_ptr<background_process> p;
  fs::path full, inc1, inc2;
  nlohmann::json full_json, inc1_json, inc2_json;

  chain() {
    p = std::make_unique<background_process>(
        std::vector<std::string>{cuda_ckpt, "run", "--", program, "run", dir.path.string()});
    REQUIRE(p->wait_for_output("ready\n"));
    full = dir.path / "full";
    inc1 = dir.path / "inc1";
    inc2 = dir.path / "inc2";
    full_json = dump_json(p->pid(), full);
    ::kill(p->pid(), SIGUSR1);  // 1 % of the memory changes
    REQUIRE(p->wait_for_output("changed 1\n"));
    inc1_json = dump_json(p->pid(), inc1, full);
    inc2_json = dump_json(p->pid(), inc2, inc1, true);  // nothing changed, checksums on the CPU as asked
  }
};

}  // namespace

TEST_CASE("incremental: full, 1 % changed, nothing changed; restore from the chain holds the live bytes",
          "[emu][incremental]") {
  chain c;
  CHECK(c.full_json["bytes"] == live_bytes);
  CHECK(c.full_json["unchanged_bytes"] == 0);
  // The emulated driver runs no kernels: the CPU computed the checksums, and --json says why. On a GPU
  // (ctest gpu.incremental) the kernel did, and unchanged blocks were not copied out of the GPU.
  if (c.full_json["checksums"]["where"] == "gpu") {
    CHECK(c.inc1_json["checksums"]["where"] == "gpu");
    CHECK(c.inc1_json["checksums"]["not_copied_bytes"] == c.inc1_json["unchanged_bytes"]);
  } else {
    CHECK_THAT(c.full_json["checksums"]["why_not_gpu"].get<std::string>(),
               Catch::Matchers::Contains("no cuModuleLoadData"));
    CHECK(c.inc1_json["checksums"]["where"] == "cpu");
  }
  CHECK(c.inc2_json["checksums"]["where"] == "cpu");
  CHECK(c.inc2_json["checksums"]["why_not_gpu"] == "not asked for (--cpu-checksums)");
  // One byte in every 100th MiB changed: one block of 1 MiB in each 100, at most one more where an
  // extent's blocks are cut short.
  INFO(c.inc1_json.dump(2));
  CHECK(c.inc1_json["bytes"].get<std::uint64_t>() >= 1 * MiB);
  CHECK(c.inc1_json["bytes"].get<std::uint64_t>() <= 2 * MiB);
  CHECK(c.inc1_json["bytes"].get<std::uint64_t>() + c.inc1_json["unchanged_bytes"].get<std::uint64_t>() == live_bytes);
  CHECK(c.inc2_json["bytes"] == 0);
  CHECK(c.inc2_json["unchanged_bytes"] == live_bytes);

  const auto verify = run_process({cuda_ckpt, "verify", c.inc2.string(), "--json"});
  INFO(describe(verify));
  REQUIRE(verify.exit_code == 0);
  CHECK(nlohmann::json::parse(verify.out)["chain"] == 3);
  const auto inspect = run_process({cuda_ckpt, "inspect", c.inc2.string()});
  CHECK_THAT(inspect.out, Catch::Matchers::Contains("chain " + c.inc2.string() + " <- " + c.inc1.string() + " <- " +
                                                    c.full.string()));

  check_restore(c.full, c.dir.path / "live-0");
  check_restore(c.inc1, c.dir.path / "live-1");
  check_restore(c.inc2, c.dir.path / "live-1");

  // merge: a full image of the same bytes, which needs nothing else.
  const auto merged =
      run_process({cuda_ckpt, "merge", c.inc2.string(), "-o", (c.dir.path / "merged").string(), "--json"});
  INFO(describe(merged));
  REQUIRE(merged.exit_code == 0);
  CHECK(nlohmann::json::parse(merged.out)["bytes"] == live_bytes);
  fs::rename(c.full, c.dir.path / "gone");
  check_restore(c.dir.path / "merged", c.dir.path / "live-1");
  fs::rename(c.dir.path / "gone", c.full);

  // cat reads across the chain too.
  const auto cat =
      run_process({cuda_ckpt, "cat", c.inc2.string(), "0x200000000000", "16", "-o", (c.dir.path / "head").string()});
  INFO(describe(cat));
  CHECK(cat.exit_code == 0);
}

TEST_CASE("incremental: changed blocks in more chunks than staging buffers; the image holds exactly them",
          "[emu][incremental]") {
  scratch_dir dir;
  background_process p({cuda_ckpt, "run", "--", program, "run", dir.path.string()});
  REQUIRE(p.wait_for_output("ready\n"));
  const fs::path full = dir.path / "full", inc = dir.path / "inc";
  // Chunks of 1 MiB, in the parent too: only an extent of the same range has blocks to compare.
  const std::vector<std::string> small_staging{"--chunk", "1M", "--staging", "2M"};
  dump_json(p.pid(), full, {}, false, small_staging);
  // Three rounds change a byte in three different MiB: three chunks of 1 MiB, and staging for two. With
  // checksums on the GPU (ctest gpu.incremental) the changed blocks are copied into a snapshot made in
  // the hold, of their size; on the CPU the bytes go out as for a full dump.
  for (int round = 1; round <= 3; ++round) {
    ::kill(p.pid(), SIGUSR1);
    REQUIRE(p.wait_for_output("changed " + std::to_string(round) + "\n"));
  }
  const auto j = dump_json(p.pid(), inc, full, false, small_staging);
  INFO(j.dump(2));
  CHECK(j["bytes"] == 3 * MiB);
  CHECK(j["unchanged_bytes"] == live_bytes - 3 * MiB);
  if (j["checksums"]["where"] == "gpu") {
    CHECK(j["checksums"]["not_copied_bytes"] == live_bytes - 3 * MiB);
    CHECK(j["gpu_snapshot"] == true);
    CHECK(j["gpu_snapshot_bytes"] == 3 * MiB);
  }
  check_restore(inc, dir.path / "live-3");
}

TEST_CASE("incremental: a missing, changed or broken parent is refused by verify and restore, naming it",
          "[emu][incremental]") {
  chain c;
  auto refused = [&](const std::string& what) {
    const auto v = run_process({cuda_ckpt, "verify", c.inc2.string()});
    INFO(describe(v));
    CHECK(v.exit_code == 1);
    CHECK_THAT(v.err, Catch::Matchers::Contains(what));
    const auto r =
        run_process({cuda_ckpt, "restore", c.inc2.string(), "--", program, "check", (c.dir.path / "live-1").string()});
    INFO(describe(r));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Matchers::Contains(what));
    CHECK_THAT(r.out + r.err, !Catch::Matchers::Contains("equal:"));  // the program never started
  };
  SECTION("missing") {
    fs::rename(c.inc1, c.dir.path / "moved-away");
    refused(c.inc2.string() + ": its parent " + c.inc1.string());
    refused("is missing");
  }
  SECTION("changed: another image under its name") {
    fs::rename(c.inc1, c.dir.path / "old-inc1");
    dump_json(c.p->pid(), c.inc1, c.full);
    refused("its parent " + c.inc1.string());
    refused("has changed: " + c.inc1.string() + " is image ");
  }
  SECTION("broken: the grandparent's data damaged where the chain reads it") {
    // live-1 differs from live-0 in one byte per 100 MiB: most of inc2's blocks come from full.
    std::fstream f(c.full / "data.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 3 * MiB + 5);
    f.put('\x42');
    f.close();
    refused("checksum mismatch");
  }
  SECTION("broken: the parent's tables damaged") {
    std::fstream f(c.inc1 / "tables.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x42');
    f.close();
    refused("its parent " + c.inc1.string());
    refused("is broken");
  }
}

TEST_CASE("incremental: rm refuses to delete a parent, --force breaks the child knowingly", "[emu][incremental]") {
  chain c;
  const auto refused = run_process({cuda_ckpt, "rm", c.inc1.string()});
  INFO(describe(refused));
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Matchers::Contains("is the parent of " + c.inc2.string()));
  CHECK(fs::exists(c.inc1 / "manifest.json"));
  // --force deletes it and names the child it breaks.
  const auto forced = run_process({cuda_ckpt, "rm", "--force", c.full.string()});
  INFO(describe(forced));
  CHECK(forced.exit_code == 0);
  CHECK_THAT(forced.out, Catch::Matchers::Contains(c.inc1.string() + ": now lacks its parent"));
  CHECK_FALSE(fs::exists(c.full));
  // A child whose parent is gone is still deleted like any image, once nothing needs it.
  CHECK(run_process({cuda_ckpt, "rm", c.inc1.string()}).exit_code == 1);  // inc2 still needs it
  CHECK(run_process({cuda_ckpt, "rm", c.inc2.string()}).exit_code == 0);
  CHECK(run_process({cuda_ckpt, "rm", c.inc1.string()}).exit_code == 0);
  CHECK_FALSE(fs::exists(c.inc1));
  CHECK(run_process({cuda_ckpt, "rm", (c.dir.path / "live-0").string()}).exit_code == 1);  // not an image
  CHECK(fs::exists(c.dir.path / "live-0"));
}

TEST_CASE("incremental: suspend --parent, and resume follows the chain", "[emu][incremental]") {
  chain c;
  const fs::path image = c.dir.path / "suspended";
  const auto s = run_process(
      {cuda_ckpt, "suspend", std::to_string(c.p->pid()), "-o", image.string(), "--parent", c.inc2.string(), "--json"});
  INFO(describe(s));
  REQUIRE(s.exit_code == 0);
  const auto r = run_process({cuda_ckpt, "resume", std::to_string(c.p->pid())});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  // A suspend image is deleted by resume and gc: it cannot be a parent.
  const auto refused = run_process(
      {cuda_ckpt, "dump", std::to_string(c.p->pid()), "-o", (c.dir.path / "x").string(), "--parent", image.string()});
  INFO(describe(refused));
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Matchers::Contains("a suspend image cannot be a parent"));
  CHECK_FALSE(fs::exists(c.dir.path / "x"));
  // The program's memory is what it was: one more change and save, then compare with a restore of a
  // fresh full dump.
  ::kill(c.p->pid(), SIGUSR1);
  REQUIRE(c.p->wait_for_output("changed 2\n"));
  dump_json(c.p->pid(), c.dir.path / "after", c.inc2);
  check_restore(c.dir.path / "after", c.dir.path / "live-2");
}

TEST_CASE("incremental: dump --every writes a series, incremental with a full image every --full-every",
          "[emu][incremental][series]") {
  scratch_dir dir;
  background_process p({cuda_ckpt, "run", "--", program, "run", dir.path.string()});
  REQUIRE(p.wait_for_output("ready\n"));
  const fs::path series = dir.path / "series";
  const auto r = run_process({cuda_ckpt, "dump", std::to_string(p.pid()), "-o", series.string(), "--every", "0.2",
                              "--count", "4", "--full-every", "2", "--json"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  std::vector<nlohmann::json> images;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) images.push_back(nlohmann::json::parse(line));
  REQUIRE(images.size() == 4);
  // 0000 full; 0001 and 0002 incremental (nothing changed: nothing written); 0003 full again.
  CHECK(images[0]["parent"].is_null());
  CHECK(images[1]["parent"] == (series / "0000").string());
  CHECK(images[2]["parent"] == (series / "0001").string());
  CHECK(images[3]["parent"].is_null());
  CHECK(images[0]["bytes"] == live_bytes);
  CHECK(images[2]["bytes"] == 0);
  CHECK(images[2]["unchanged_bytes"] == live_bytes);
  CHECK(images[3]["bytes"] == live_bytes);
  check_restore(series / "0002", dir.path / "live-0");

  // A second series in the same directory goes on numbering; it ends when the process does.
  background_process second({cuda_ckpt, "dump", std::to_string(p.pid()), "-o", series.string(), "--every", "0.2"});
  REQUIRE(second.wait_for_output("dumped"));
  ::kill(p.pid(), SIGTERM);
  CHECK(second.wait_for_output("has ended"));
  CHECK(second.wait() == 0);
  CHECK(fs::exists(series / "0004" / "manifest.json"));
  for (const auto& entry : fs::directory_iterator(series))
    CHECK(entry.path().filename().string().find(".partial-") == std::string::npos);

  // The series' options belong to a series.
  const auto lone = run_process({cuda_ckpt, "dump", "1", "--count", "3"});
  CHECK(lone.exit_code == 2);
  CHECK_THAT(lone.err, Catch::Matchers::Contains("apply to a series of dumps (--every)"));
}

TEST_CASE("incremental: a series notices its last image changed, even to the same size and time, and writes a "
          "full one instead of building on it",
          "[emu][incremental][series]") {
  scratch_dir dir;
  background_process p({cuda_ckpt, "run", "--", program, "run", dir.path.string()});
  REQUIRE(p.wait_for_output("ready\n"));
  const fs::path series = dir.path / "series";
  const bool same_size_and_time = GENERATE(false, true);
  INFO((same_size_and_time ? "a byte changed in place, its size and modification time kept" : "a byte appended"));
  // The series keeps the image it has just written as the next one's parent, rather than reading it again.
  // Its dumps are due at 0, 4 and 8 s from its start: the change below must land before the second, and a
  // loaded machine (tests side by side) can make the first dump itself take seconds.
  background_process s({"/bin/sh", "-c",
                        "exec \"$0\" dump " + std::to_string(p.pid()) + " -o \"$1\" --every 4 --count 3 --json 2>&1",
                        cuda_ckpt, series.string()});
  REQUIRE(s.wait_for_output("\n"));  // the first image's line
  const fs::path data = series / "0000" / "data.bin";
  if (same_size_and_time) {
    const auto written = fs::last_write_time(data);
    flip_byte(data, fs::file_size(data) / 2);
    fs::last_write_time(data, written);
  } else {
    std::ofstream(data, std::ios::binary | std::ios::app) << 'x';
  }
  REQUIRE(s.wait_for_output((series / "0002").string() + "\""));
  CHECK(s.wait() == 0);
  std::vector<nlohmann::json> images;
  std::istringstream lines(s.output());
  for (std::string line; std::getline(lines, line);) images.push_back(nlohmann::json::parse(line));
  REQUIRE(images.size() == 3);
  // 0001 does not build on the changed 0000: it is full, and says why, naming it; 0002 builds on 0001.
  CHECK(images[1]["parent"].is_null());
  CHECK_THAT(images[1].value("parent_dropped", ""), Catch::Matchers::Contains((series / "0000").string()));
  CHECK(images[1]["bytes"] == live_bytes);
  CHECK(images[2]["parent"] == (series / "0001").string());
  for (const char* name : {"0001", "0002"}) {
    const auto v = run_process({cuda_ckpt, "verify", (series / name).string()});
    INFO(name << describe(v));
    CHECK(v.exit_code == 0);
  }
  CHECK(run_process({cuda_ckpt, "verify", (series / "0000").string()}).exit_code == 1);
  for (const auto& entry : fs::directory_iterator(series))
    CHECK(entry.path().filename().string().find(".partial-") == std::string::npos);
  CHECK(p.running());
}

TEST_CASE("zero blocks: an arena written a little is dumped, restored, suspended and resumed with every byte",
          "[emu][incremental][zero]") {
  // Every process of this test gets device memory full of 0xa5 bytes: a restore or resume must write the zero
  // blocks' zeros (on the device), never leave them to fresh memory.
  struct dirty_memory {
    dirty_memory() { ::setenv("VMMCKPT_EMU_DIRTY_MEMORY", "1", 1); }
    ~dirty_memory() { ::unsetenv("VMMCKPT_EMU_DIRTY_MEMORY"); }
  } dirty;
  scratch_dir dir;
  background_process p({cuda_ckpt, "run", "--", program, "run-sparse", dir.path.string()});
  REQUIRE(p.wait_for_output("ready\n"));
  const std::uint64_t written = 4 * MiB, zero = live_bytes - written;  // the first MiB of each allocation

  // The image holds what the program wrote; its zero blocks are recorded, not written.
  const fs::path full = dir.path / "full";
  const auto dumped = dump_json(p.pid(), full);
  INFO(dumped.dump(2));
  CHECK(dumped["bytes"] == written);
  CHECK(dumped["zero_bytes"] == zero);
  std::uint64_t on_disk = 0;
  for (const auto& f : fs::directory_iterator(full))
    if (f.path().filename().string().rfind("data", 0) == 0) on_disk += fs::file_size(f.path());
  CHECK(on_disk < written + 64 * 64);
  const auto inspect = run_process({cuda_ckpt, "inspect", full.string()});
  CHECK_THAT(inspect.out, Catch::Matchers::Contains("zero      96.00 MiB"));
  const auto inspect_json = run_process({cuda_ckpt, "inspect", full.string(), "--json"});
  CHECK(nlohmann::json::parse(inspect_json.out)["zero_bytes"] == zero);
  const auto verify = run_process({cuda_ckpt, "verify", full.string()});
  INFO(describe(verify));
  CHECK(verify.exit_code == 0);
  check_restore(full, dir.path / "live-0");  // every byte, zero or not
  const auto replay = run_process(
      {cuda_ckpt, "restore", full.string(), "--replay", "--", program, "check", (dir.path / "live-0").string()});
  INFO(describe(replay));
  CHECK(replay.exit_code == 0);

  // suspend frees the arena, resume brings every byte back: a dump after it restores to the same bytes.
  const auto suspended = run_process({cuda_ckpt, "suspend", std::to_string(p.pid()), "--json"});
  INFO(describe(suspended));
  REQUIRE(suspended.exit_code == 0);
  CHECK(nlohmann::json::parse(suspended.out)["zero_bytes"] == zero);
  const auto resumed = run_process({cuda_ckpt, "resume", std::to_string(p.pid())});
  INFO(describe(resumed));
  REQUIRE(resumed.exit_code == 0);
  const fs::path after = dir.path / "after-resume";
  dump_json(p.pid(), after);
  check_restore(after, dir.path / "live-0");

  // A written block zeroed again, and a zero block written: the child has one of each, and restores.
  ::kill(p.pid(), SIGUSR1);
  REQUIRE(p.wait_for_output("changed 1\n"));
  const fs::path inc = dir.path / "inc";
  const auto child = dump_json(p.pid(), inc, full);
  INFO(child.dump(2));
  CHECK(child["bytes"] == MiB);       // the zero block written
  CHECK(child["zero_bytes"] == MiB);  // the written block zeroed
  CHECK(child["unchanged_bytes"] == live_bytes - 2 * MiB);
  check_restore(inc, dir.path / "live-1");
}
