// End-to-end tests of cuda-ckpt suspend and resume: GPU memory freed under a live program and given back.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

nlohmann::json process_state(pid_t pid) {
  const auto ps = run_process({cuda_ckpt, "ps", "--json"});
  for (const auto& p : nlohmann::json::parse(ps.out))
    if (p.at("pid").get<pid_t>() == pid) return p;
  FAIL("process " << pid << " is not listed by ps");
  return {};
}

}  // namespace

TEST_CASE("fifty suspend/resume cycles under continuous stream work", "[emu][suspend]") {
  scratch_dir dir;
  auto program = start_writer();
  const pid_t pid = program->pid();
  for (int cycle = 0; cycle < 50; ++cycle) {
    const fs::path image = dir.path / ("suspend-" + std::to_string(cycle));
    const auto s = run_process({cuda_ckpt, "suspend", std::to_string(pid), "-o", image.string(), "--json"});
    INFO("cycle " << cycle << "\n" << describe(s));
    REQUIRE(s.exit_code == 0);
    const auto result = nlohmann::json::parse(s.out);
    REQUIRE(result.at("freed_bytes").get<std::uint64_t>() >= writer_buffers * writer_buffer_size);
    const auto state = process_state(pid);
    REQUIRE(state.at("state") == "suspended");
    REQUIRE(state.at("pools").at(0).at("backed_bytes").get<std::uint64_t>() == 0);  // the memory is really gone
    require_untorn(image);
    const auto r = run_process({cuda_ckpt, "resume", std::to_string(pid)});
    INFO(describe(r));
    REQUIRE(r.exit_code == 0);
    REQUIRE(process_state(pid).at("state") == "running");
    fs::remove_all(image);
  }
  REQUIRE(program->running());
  // After all that, the program's memory is consistent and its work goes on.
  const fs::path last = dir.path / "last";
  REQUIRE(run_process({cuda_ckpt, "dump", std::to_string(pid), "-o", last.string()}).exit_code == 0);
  require_untorn(last);
}

TEST_CASE("suspend and resume refuse the wrong state with a clear error", "[emu][suspend]") {
  scratch_dir dir;
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  const auto not_suspended = run_process({cuda_ckpt, "resume", pid});
  REQUIRE(not_suspended.exit_code == 1);
  REQUIRE(not_suspended.err.find("is not suspended") != std::string::npos);
  REQUIRE(run_process({cuda_ckpt, "suspend", pid, "-o", (dir.path / "one").string()}).exit_code == 0);
  const auto twice = run_process({cuda_ckpt, "suspend", pid, "-o", (dir.path / "two").string()});
  REQUIRE(twice.exit_code == 1);
  REQUIRE(twice.err.find("already suspended") != std::string::npos);
  REQUIRE_FALSE(fs::exists(dir.path / "two"));
  const auto dump = run_process({cuda_ckpt, "dump", pid, "-o", (dir.path / "three").string()});
  REQUIRE(dump.exit_code == 1);
  REQUIRE(dump.err.find("resume it first") != std::string::npos);
  REQUIRE(run_process({cuda_ckpt, "resume", pid}).exit_code == 0);
}

TEST_CASE("a resume from a damaged image fails, the program stays suspended, and a retry works", "[emu][suspend]") {
  scratch_dir dir;
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  const fs::path image = dir.path / "image";
  REQUIRE(run_process({cuda_ckpt, "suspend", pid, "-o", image.string()}).exit_code == 0);
  // Damage one byte of the saved memory.
  std::fstream data(image / "data.bin", std::ios::in | std::ios::out | std::ios::binary);
  data.seekg(64 + 4096);
  const char original = static_cast<char>(data.get());
  data.seekp(64 + 4096);
  data.put(static_cast<char>(original ^ 0x40));
  data.flush();
  const auto bad = run_process({cuda_ckpt, "resume", pid});
  INFO(describe(bad));
  REQUIRE(bad.exit_code == 1);
  REQUIRE(bad.err.find("checksum mismatch") != std::string::npos);
  REQUIRE(bad.err.find("stays suspended") != std::string::npos);
  REQUIRE(process_state(program->pid()).at("state") == "suspended");
  REQUIRE(program->running());
  // Repaired, the same image resumes the program.
  data.seekp(64 + 4096);
  data.put(original);
  data.close();
  const auto good = run_process({cuda_ckpt, "resume", pid});
  INFO(describe(good));
  REQUIRE(good.exit_code == 0);
  require_untorn(image);
  REQUIRE(process_state(program->pid()).at("state") == "running");
}

TEST_CASE("a suspend whose tool dies before the image is complete frees nothing", "[emu][suspend][leftovers]") {
  scratch_dir dir;
  auto program = start_writer();
  const fs::path image = dir.path / "image";
  background_process tool({cuda_ckpt, "suspend", std::to_string(program->pid()), "-o", image.string()},
                          {{"VMMCKPT_TEST_FAULT", "releasing=pause:5000"}});
  usleep(700'000);
  kill(tool.pid(), SIGKILL);
  tool.wait();
  usleep(200'000);
  const auto state = process_state(program->pid());
  REQUIRE(state.at("state") == "running");
  REQUIRE(state.at("pools").at(0).at("backed_bytes").get<std::uint64_t>() > 0);
  REQUIRE_FALSE(fs::exists(image));
  REQUIRE(
      run_process({cuda_ckpt, "dump", std::to_string(program->pid()), "-o", (dir.path / "after").string()}).exit_code ==
      0);
}

TEST_CASE("the default suspend image lives on /dev/shm and resume removes it", "[emu][suspend]") {
  auto program = start_writer();
  const std::string pid = std::to_string(program->pid());
  const auto s = run_process({cuda_ckpt, "suspend", pid, "--json"});
  INFO(describe(s));
  REQUIRE(s.exit_code == 0);
  const fs::path image = nlohmann::json::parse(s.out).at("image").get<std::string>();
  REQUIRE(image.string().rfind("/dev/shm/vmmckpt-" + std::to_string(geteuid()) + "/", 0) == 0);
  REQUIRE(fs::exists(image / "manifest.json"));
  REQUIRE(process_state(program->pid()).at("image") == image.string());
  REQUIRE(run_process({cuda_ckpt, "resume", pid}).exit_code == 0);
  REQUIRE_FALSE(fs::exists(image));
}

TEST_CASE("under a tight ulimit -v, suspend sets aside what resume needs or refuses: never suspended for good",
          "[emu][suspend]") {
  // The limit is set on the running program (prlimit), a little past the address space it has then: what it
  // took at its start and in its first dump does not count, and neither does how busy this machine is.
  const std::map<std::string, std::string> small_pool{{"VMMCKPT_POOL_SIZE", "64M"}};
  auto size_kib = [](pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("VmSize:", 0) == 0) return std::stol(line.substr(7));
    return 0L;
  };
  int refused = 0, suspended = 0;
  // Address space to spare: from less than the resume's buffers and threads need (96 MiB) to more.
  for (const long headroom_mib : {12L, 28L, 64L, 160L, 320L}) {
    scratch_dir dir;
    background_process p({cuda_ckpt, "run", "--", writer_program, "--seconds", "60"}, small_pool);
    REQUIRE(p.wait_for_output("ready\n"));
    const std::string pid = std::to_string(p.pid());
    REQUIRE(run_process({cuda_ckpt, "dump", pid, "-o", (dir.path / "image").string()}).exit_code == 0);
    const long limit_kib = size_kib(p.pid()) + headroom_mib * 1024;
    INFO("ulimit -v " << limit_kib << " KiB (" << headroom_mib << " MiB past the program's size)");
    const auto limited = run_process({"prlimit", "--pid", pid, "--as=" + std::to_string(limit_kib * 1024)});
    INFO(describe(limited));
    REQUIRE(limited.exit_code == 0);
    const auto s = run_process({cuda_ckpt, "suspend", pid});
    INFO(describe(s));
    if (s.exit_code != 0) {
      // Refused: the program goes on, its memory untouched, and says why.
      refused += s.err.find("no host memory for what its resume will need") != std::string::npos;
      CHECK(listed_state(p.pid())["state"] == "running");
      CHECK(run_process({cuda_ckpt, "check", pid}).exit_code == 0);
      continue;
    }
    // Suspended: the resume finds what it needs.
    ++suspended;
    const auto r = run_process({cuda_ckpt, "resume", pid});
    INFO(describe(r));
    CHECK(r.exit_code == 0);
    CHECK(listed_state(p.pid())["state"] == "running");
  }
  CHECK(refused > 0);
  CHECK(suspended > 0);
}

TEST_CASE("resume --deadline: a stopped program is named, and stays suspended when it goes on", "[emu][suspend]") {
  scratch_dir dir;
  auto program = start_writer();
  const pid_t pid = program->pid();
  REQUIRE(run_process({cuda_ckpt, "suspend", std::to_string(pid), "-o", (dir.path / "image").string()}).exit_code == 0);
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  const auto start = std::chrono::steady_clock::now();
  const auto waited = run_process({cuda_ckpt, "resume", std::to_string(pid), "--deadline", "2"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::kill(pid, SIGCONT);
  INFO(describe(waited) << "after " << seconds << " s");
  CHECK(waited.exit_code == 1);
  CHECK(waited.err.find("process " + std::to_string(pid)) != std::string::npos);
  CHECK(waited.err.find("kill -CONT " + std::to_string(pid)) != std::string::npos);
  CHECK(seconds < 2 + 3);  // 2 s, and slack for a loaded machine
  // The request expired with the deadline: continued, the program refuses it and stays suspended.
  CHECK(process_state(pid).at("state") == "suspended");
  const auto resumed = run_process({cuda_ckpt, "resume", std::to_string(pid)});
  INFO(describe(resumed));
  CHECK(resumed.exit_code == 0);
  require_untorn(dir.path / "image");
}
