// End-to-end tests of cuda-ckpt dump, ps, inspect and verify: a busy program under the shim, dumped while it runs.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

process_result dump(pid_t pid, const fs::path& out, std::map<std::string, std::string> env = {},
                    std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {cuda_ckpt, "dump", std::to_string(pid), "-o", out.string(), "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_process(args, env, 120);
}

bool left_behind(const fs::path& p) { return fs::exists(fs::symlink_status(p)); }

// Nothing named like an image, finished or partial, next to `out`.
void require_nothing_left(const fs::path& out) {
  REQUIRE_FALSE(left_behind(out));
  for (const auto& entry : fs::directory_iterator(out.parent_path()))
    REQUIRE(entry.path().filename().string().rfind(out.filename().string(), 0) != 0);
}

}  // namespace

TEST_CASE("a busy program dumped many times: every image verifies and holds no torn buffer", "[emu][dump]") {
  scratch_dir dir;
  auto program = start_writer();
  for (int i = 0; i < 12; ++i) {
    const fs::path out = dir.path / ("image-" + std::to_string(i));
    // Both ways of holding: until a copy on the GPU is made (the device has room here), and until
    // the bytes are on the host; with one data file and with several.
    const bool direct = i % 2 == 1;
    std::vector<std::string> extra = {"--writers", std::to_string(1 + i % 4), "--chunk", "1M"};
    if (direct) extra.push_back("--no-gpu-snapshot");
    const auto r = dump(program->pid(), out, {}, extra);
    INFO(describe(r));
    REQUIRE(r.exit_code == 0);
    const auto result = nlohmann::json::parse(r.out);
    REQUIRE(result.at("gpu_snapshot").get<bool>() == !direct);
    REQUIRE(result.at("data_files").get<int>() == 1 + i % 4);
    REQUIRE(result.at("allocations").get<int>() >= 8);
    REQUIRE(result.at("hold_ms").get<double>() > 0);
    const auto verified = run_process({cuda_ckpt, "verify", out.string()});
    INFO(describe(verified));
    REQUIRE(verified.exit_code == 0);
    require_untorn(out);
    // Images hold program memory: owner-only.
    struct stat st {};
    REQUIRE(::stat((out / "data.bin").c_str(), &st) == 0);
    REQUIRE((st.st_mode & 0777) == 0600);
  }
  REQUIRE(program->running());  // unharmed, still working
}

TEST_CASE("a device with room for part of the bytes: the last chunks go to a GPU copy, the rest out", "[emu][dump]") {
  scratch_dir dir;
  auto program = start_writer();
  // The tool's emulated device has 8 MiB, a quarter of which stays free: room for 6 of the
  // program's 8+ chunks of 1 MiB.
  const fs::path out = dir.path / "image";
  const auto r = dump(program->pid(), out, {{"VMMCKPT_EMU_MEM", "8M"}}, {"--chunk", "1M", "--writers", "3"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  const auto result = nlohmann::json::parse(r.out);
  REQUIRE(result.at("gpu_snapshot").get<bool>());
  const auto in_snapshot = result.at("gpu_snapshot_bytes").get<std::uint64_t>();
  REQUIRE(in_snapshot > 0);
  REQUIRE(in_snapshot <= 6 * (1u << 20));
  REQUIRE(in_snapshot < result.at("bytes").get<std::uint64_t>());
  const auto verified = run_process({cuda_ckpt, "verify", out.string()});
  INFO(describe(verified));
  REQUIRE(verified.exit_code == 0);
  require_untorn(out);
  REQUIRE(program->running());
}

TEST_CASE("ps lists the program; inspect shows its allocations", "[emu][dump]") {
  scratch_dir dir;
  auto program = start_writer();
  const auto ps = run_process({cuda_ckpt, "ps", "--json"});
  INFO(describe(ps));
  REQUIRE(ps.exit_code == 0);
  bool listed = false;
  for (const auto& p : nlohmann::json::parse(ps.out))
    if (p.at("pid").get<pid_t>() == program->pid()) {
      listed = true;
      REQUIRE(p.at("state") == "running");
      REQUIRE(p.at("pools").at(0).at("live_bytes").get<std::uint64_t>() >= writer_buffers * writer_buffer_size);
    }
  REQUIRE(listed);
  const auto human = run_process({cuda_ckpt, "ps"});
  REQUIRE(human.out.find(std::to_string(program->pid())) != std::string::npos);

  const fs::path out = dir.path / "image";
  REQUIRE(dump(program->pid(), out).exit_code == 0);
  const auto inspect = run_process({cuda_ckpt, "inspect", out.string()});
  REQUIRE(inspect.exit_code == 0);
  REQUIRE(inspect.out.find("0x200000000000") != std::string::npos);
  REQUIRE(inspect.out.find("emu_busy_writer") != std::string::npos);
  const auto inspect_json = run_process({cuda_ckpt, "inspect", "--json", out.string()});
  REQUIRE(nlohmann::json::parse(inspect_json.out).at("pid").get<pid_t>() == program->pid());
}

TEST_CASE("dump refuses bad targets with a clear error and writes nothing", "[emu][dump]") {
  scratch_dir dir;
  const fs::path out = dir.path / "image";

  SECTION("a pid that does not exist") {
    const auto r = dump(999999999, out);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.find("no process 999999999") != std::string::npos);
  }
  SECTION("a process without the shim") {
    background_process plain({"sleep", "30"});
    const auto r = dump(plain.pid(), out);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.find("not running under vmmckpt") != std::string::npos);
  }
  SECTION("an image that already exists") {
    auto program = start_writer();
    fs::create_directory(out);
    const auto r = dump(program->pid(), out);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.find("already exists") != std::string::npos);
    fs::remove(out);
    REQUIRE(program->running());
  }
  require_nothing_left(out);
}

TEST_CASE("dump refuses a process of another user and writes nothing", "[emu][dump]") {
  if (geteuid() != 0) VMMCKPT_SKIP("needs root to run the tool as another user");
  scratch_dir dir;
  const fs::path out = dir.path / "image";
  // Our program, and the tool run by somebody else.
  auto program = start_writer();
  const auto r = run_process({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", cuda_ckpt, "dump",
                              std::to_string(program->pid()), "-o", out.string()});
  INFO(describe(r));
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("belongs to another user") != std::string::npos);
  REQUIRE(program->running());
  require_nothing_left(out);
}

TEST_CASE("a program that exits during the dump: a clear error and no image", "[emu][dump]") {
  scratch_dir dir;
  auto program = start_writer();
  const fs::path out = dir.path / "image";
  const pid_t pid = program->pid();
  // The tool pauses while it holds the program; the program dies meanwhile.
  background_process tool({"sh", "-c",
                           "exec '" + cuda_ckpt + "' dump " + std::to_string(pid) + " -o '" + out.string() + "' 2>" +
                               (dir.path / "tool.err").string()},
                          {{"VMMCKPT_TEST_FAULT", "releasing=pause:1500"}});
  usleep(500'000);
  kill(pid, SIGKILL);
  REQUIRE(tool.wait() == 1);
  std::ifstream err(dir.path / "tool.err");
  const std::string message((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  INFO(message);
  REQUIRE(message.find("went away") != std::string::npos);
  require_nothing_left(out);
}

namespace {
// What a killed tool leaves: never the final name, and nothing that verifies.
void require_no_valid_leftover(const fs::path& out) {
  REQUIRE_FALSE(left_behind(out));
  for (const auto& entry : fs::directory_iterator(out.parent_path())) {
    if (entry.path().filename().string().rfind(out.filename().string(), 0) != 0) continue;
    const auto r = run_process({cuda_ckpt, "verify", entry.path().string()});
    REQUIRE(r.exit_code == 1);
  }
}
}  // namespace

TEST_CASE("a file-size limit during a dump or suspend: a clear error, no image, the program unharmed", "[emu][dump]") {
  scratch_dir dir;
  auto program = start_writer();
  // A file size limit stands in for a full disk: writes fail with EFBIG. SIGXFSZ keeps its default
  // disposition (it kills a process that ignores nothing): the tool must not die of it.
  for (const std::string command : {"dump", "suspend"}) {
    DYNAMIC_SECTION(command) {
      const fs::path out = dir.path / ("image-" + command);
      const auto r = run_process({"sh", "-c",
                                  "trap - XFSZ; ulimit -f 2048; exec '" + cuda_ckpt + "' " + command + " " +
                                      std::to_string(program->pid()) + " -o '" + out.string() + "'"});
      INFO(describe(r));
      REQUIRE(r.signal == 0);
      REQUIRE(r.exit_code == 1);
      REQUIRE(r.err.find("data.bin") != std::string::npos);
      REQUIRE(r.err.find("File too large") != std::string::npos);
      require_nothing_left(out);
      REQUIRE(program->running());
      // The program was released (not suspended) and can be dumped again.
      const fs::path again = dir.path / ("again-" + command);
      REQUIRE(dump(program->pid(), again).exit_code == 0);
      require_untorn(again);
    }
  }
}

TEST_CASE("a dump tool killed while holding the program: the program goes on", "[emu][dump]") {
  scratch_dir dir;
  auto program = start_writer();
  const fs::path out = dir.path / "image";
  background_process tool({cuda_ckpt, "dump", std::to_string(program->pid()), "-o", out.string()},
                          {{"VMMCKPT_TEST_FAULT", "releasing=pause:5000"}});
  usleep(700'000);
  kill(tool.pid(), SIGKILL);
  tool.wait();
  require_no_valid_leftover(out);
  // The gate reopened when the connection dropped: the next dump works at once.
  REQUIRE(dump(program->pid(), dir.path / "after").exit_code == 0);
  REQUIRE(program->running());
}

TEST_CASE("the hold deadline releases the program even when the tool stalls", "[emu][dump]") {
  scratch_dir dir;
  auto program = start_writer();
  const fs::path out = dir.path / "image";
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_process({cuda_ckpt, "dump", std::to_string(program->pid()), "-o", out.string(), "--deadline", "1"},
                             {{"VMMCKPT_TEST_FAULT", "releasing=pause:3000"}});
  INFO(describe(r));
  REQUIRE(r.exit_code == 1);  // the program was released before the tool said it was done
  REQUIRE(r.err.find("hold deadline passed") != std::string::npos);
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  require_nothing_left(out);
  REQUIRE(program->running());
  REQUIRE(dump(program->pid(), dir.path / "after").exit_code == 0);
}

TEST_CASE("a slow disk: the hold ends once the bytes are in host memory; a staging too small says so",
          "[emu][dump][staging]") {
  // emu_incremental: 100 MiB of non-zero bytes, saved as live-0 for the restored program to compare.
  const std::string program = programs + "emu_incremental";
  constexpr std::uint64_t MiB = 1ULL << 20, live = 100 * MiB;
  scratch_dir dir;
  background_process p({cuda_ckpt, "run", "--", program, "run", dir.path.string()});
  REQUIRE(p.wait_for_output("ready\n"));
  // Each 1 MiB chunk takes the image 20 ms to write: 2 s for them all, on one writer, out of 4 pinned buffers.
  const std::map<std::string, std::string> slow_disk{{"VMMCKPT_TEST_FAULT", "writing-chunk=slow:20"}};
  const std::vector<std::string> small_pinned{"--chunk", "1M", "--writers", "1", "--no-gpu-snapshot"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), small_pinned.begin(), small_pinned.end());
    return more;
  };
  // A dump on the slow disk that must succeed, and its --json.
  auto slow_dump = [&](const fs::path& out, const std::vector<std::string>& more) {
    const auto r = dump(p.pid(), out, slow_disk, with(more));
    INFO(describe(r));
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out);
  };

  // Ordinary memory takes what the pinned buffers cannot: the program goes on long before the writes end.
  const fs::path parked = dir.path / "parked";
  const auto j = slow_dump(parked, {"--pinned", "4M"});
  INFO(j.dump(2));
  CHECK(j["staged_bytes"] == live);
  CHECK(j["parked_bytes"].get<std::uint64_t>() >= live - 8 * MiB);
  CHECK(j["held_write_bytes"] == 0);
  CHECK(j["staging_needed_bytes"] == 0);
  CHECK(j["released_s"].get<double>() > 0);
  CHECK(j["released_s"].get<double>() + 1.5 < j["seconds"].get<double>());  // the 96 parked MiB written after
  CHECK(j["hold_ms"].get<double>() + 1500 < j["seconds"].get<double>() * 1000);
  const auto verified = run_process({cuda_ckpt, "verify", parked.string()});
  INFO(describe(verified));
  CHECK(verified.exit_code == 0);
  const auto restored =
      run_process({cuda_ckpt, "restore", parked.string(), "--", program, "check", (dir.path / "live-0").string()});
  INFO(describe(restored));
  CHECK(restored.exit_code == 0);
  CHECK_THAT(restored.out, Catch::Matchers::Contains("equal: " + std::to_string(live) + " bytes"));

  // A staging of 4 MiB in all: the program waits for the writes, and the output says what would have spared it.
  const fs::path held = dir.path / "held";
  const auto hj = slow_dump(held, {"--staging", "4M"});
  INFO(hj.dump(2));
  CHECK(hj["parked_bytes"] == 0);
  CHECK(hj["held_write_bytes"].get<std::uint64_t>() >= live - 8 * MiB);
  CHECK(hj["staging_needed_bytes"].get<std::uint64_t>() >= live);
  CHECK(hj["hold_ms"].get<double>() > 1500);  // 96 chunks of 20 ms written while held
  const fs::path held_text = dir.path / "held-text";
  auto text_args = with({"--staging", "4M"});
  text_args.insert(text_args.begin(), {cuda_ckpt, "dump", std::to_string(p.pid()), "-o", held_text.string()});
  const auto t = run_process(text_args, slow_disk, 120);
  INFO(describe(t));
  CHECK(t.exit_code == 0);
  CHECK_THAT(t.out, Catch::Matchers::Contains("the hold covered writes") &&
                        Catch::Matchers::Contains("--staging 10") /* 100 or more MiB */);
  CHECK(run_process({cuda_ckpt, "verify", held.string()}).exit_code == 0);
}
