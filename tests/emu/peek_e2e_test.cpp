// End-to-end tests of cuda-ckpt peek and poke (docs/peek.md): a running program's memory read and written by the
// real tool through the real shim, on the emulated driver.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <sstream>
#include <string>
#include <vector>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string target_program = programs + "emu_peek_target";
const std::map<std::string, std::string> no_driver = {{"VMMCKPT_LIBCUDA", "/nonexistent/libcuda.so.1"},
                                                      {"LD_LIBRARY_PATH", ""}};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The address a program printed for `what` ("ptr ADDR SIZE what").
std::string address_of(const std::string& output, const std::string& what) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string tag, addr, size, name;
    if (words >> tag >> addr >> size >> name && tag == "ptr" && name == what) return addr;
  }
  FAIL("no ptr line for " << what << " in:\n" << output);
  return {};
}

std::string pattern_bytes(std::size_t n) {
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i % 251);
  return out;
}

struct target {
  background_process program{{cuda_ckpt, "run", "--", target_program, "--seconds", "120"}};
  std::string pattern, counter, pid;
  target() {
    REQUIRE(program.wait_for_output("ready\n"));
    pattern = address_of(program.output(), "pattern");
    counter = address_of(program.output(), "counter");
    pid = std::to_string(program.pid());
  }
  process_result peek(std::vector<std::string> args, const std::map<std::string, std::string>& env = {}) const {
    args.insert(args.begin(), {cuda_ckpt, "peek", pid});
    return run_process(args, env);
  }
};

}  // namespace

TEST_CASE("peek reads a running program's bytes, the same a dump of it holds", "[emu][peek]") {
  target t;
  scratch_dir scratch;
  const fs::path out = scratch.path / "peeked";
  for (const char* order : {"--live", "--ordered", "--quiesce"}) {
    const auto r = t.peek({t.pattern, "4096", "-o", out.string(), order});
    INFO(order << "\n" << describe(r));
    REQUIRE(r.exit_code == 0);
    CHECK(file_text(out) == pattern_bytes(4096));
    fs::remove(out);
  }
  // By name, and at an offset into the name; the whole allocation with --alloc.
  auto r = t.peek({"pattern+16", "16", "-o", out.string()});
  REQUIRE(r.exit_code == 0);
  CHECK(file_text(out) == pattern_bytes(32).substr(16));
  fs::remove(out);
  r = t.peek({"0x" + std::string(t.pattern.substr(2)), "--alloc", "-o", out.string()});
  REQUIRE(r.exit_code == 0);
  CHECK(file_text(out).size() == 4096);

  const fs::path image = scratch.path / "image";
  const auto dumped = run_process({cuda_ckpt, "dump", t.pid, "-o", image.string()}, {}, 120);
  INFO(describe(dumped));
  REQUIRE(dumped.exit_code == 0);
  const auto cat = run_process({cuda_ckpt, "cat", image.string(), t.pattern, "4096"});
  REQUIRE(cat.exit_code == 0);
  CHECK(cat.out == file_text(out));
}

TEST_CASE("peek by copy needs no CUDA driver in the reader; by map it says it needs one", "[emu][peek]") {
  target t;
  auto r = t.peek({t.pattern, "64", "--json"}, no_driver);
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["via"] == "copy");
  CHECK(j["order"] == "live");
  CHECK(j["addr"] == t.pattern);
  CHECK(j["name"] == "pattern");
  CHECK(j["hex"].get<std::string>().substr(0, 8) == "00010203");
  r = t.peek({t.pattern, "64", "--via", "map"}, no_driver);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.err, "driver"));
  // With a driver, the tool maps the program's memory itself and reads the same bytes.
  r = t.peek({t.pattern, "4096", "--via", "map", "--json"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out)["via"] == "map");
}

TEST_CASE("peek of memory the program does not own exits 1 naming it and writes nothing", "[emu][peek]") {
  target t;
  scratch_dir scratch;
  const fs::path out = scratch.path / "never";
  auto r = t.peek({"0x1234", "16", "-o", out.string()});
  CHECK(r.exit_code == 1);
  CHECK(contains(r.err, "0x1234 is not in an allocation of this program that vmmckpt owns"));
  r = t.peek({t.pattern, "8192", "-o", out.string()});  // past the end of its 4 KiB allocation
  CHECK(r.exit_code == 1);
  CHECK(contains(r.err, "runs past the end of its allocation"));
  r = t.peek({"nosuchname", "-o", out.string()});
  CHECK(r.exit_code == 1);
  CHECK(contains(r.err, "no range of this program is named \"nosuchname\""));
  CHECK_FALSE(fs::exists(out));
  CHECK(t.peek({"0xZZ", "16"}).exit_code == 2);
  CHECK(t.peek({t.pattern, "0"}).exit_code == 2);
  CHECK(t.peek({t.pattern, "16", "--live", "--quiesce"}).exit_code == 2);
  CHECK(t.peek({t.pattern, "64", "-t", "f32", "--shape", "3,3"}).exit_code == 2);
  CHECK(run_process({cuda_ckpt, "peek", "999999999", "0x1000"}).exit_code == 1);
  // The program goes on unharmed.
  CHECK(t.program.running());
  CHECK(t.peek({t.pattern, "16", "-o", out.string()}).exit_code == 0);
}

TEST_CASE("poke writes a running program's memory, only with --yes, and the program reads it back", "[emu][peek]") {
  target t;
  scratch_dir scratch;
  const fs::path bytes = scratch.path / "bytes";
  {
    std::ofstream f(bytes, std::ios::binary);
    f << std::string("\x11\x22\x33\x44\x55\x66\x77\x88", 8);
  }
  auto r = run_process({cuda_ckpt, "poke", t.pid, t.pattern, bytes.string()});
  CHECK(r.exit_code == 2);
  CHECK(contains(r.err, "--yes"));
  r = run_process({cuda_ckpt, "poke", t.pid, "0x1234", bytes.string(), "--yes"});
  CHECK(r.exit_code == 1);
  CHECK(contains(r.err, "0x1234"));
  r = run_process({cuda_ckpt, "poke", t.pid, "pattern", bytes.string(), "--yes", "--json"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out)["size"] == 8);
  REQUIRE(t.program.wait_for_output("changed 1122334455667788\n"));
  const fs::path out = scratch.path / "peeked";
  REQUIRE(t.peek({t.pattern, "16", "-o", out.string()}).exit_code == 0);
  CHECK(file_text(out) == std::string("\x11\x22\x33\x44\x55\x66\x77\x88", 8) + pattern_bytes(16).substr(8));
}

TEST_CASE("peek lists, types, summarizes and watches a running program's memory", "[emu][peek]") {
  target t;
  scratch_dir scratch;
  auto r = t.peek({"--list", "--json"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["allocations"].size() == 2);
  CHECK(j["allocations"][0]["addr"] == t.pattern);
  CHECK(j["names"][0]["name"] == "pattern");
  r = t.peek({t.pattern, "16", "-t", "u8"});
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.out, "0 1 2 3 4 5 6 7"));
  r = t.peek({t.pattern, "256", "-t", "u8", "--stats", "--json"});
  REQUIRE(r.exit_code == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["stats"]["count"] == 256);
  CHECK(j["stats"]["max"] == 250.0);
  const fs::path npy = scratch.path / "p.npy";
  REQUIRE(t.peek({t.pattern, "4096", "-t", "f32", "--shape", "4,256", "--npy", npy.string(), "--stats"}).exit_code ==
          0);
  CHECK(file_text(npy).substr(0, 6) == "\x93NUMPY");
  CHECK(contains(file_text(npy), "'shape': (4, 256)"));
  // The counter the program rewrites every millisecond, five times a tenth of a second apart: it moves on.
  r = t.peek({t.counter, "8", "-t", "i64", "--watch", "0.1", "--count", "5", "--json"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  std::vector<std::uint64_t> seen;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const std::string hex = nlohmann::json::parse(line)["hex"];
    std::uint64_t v = 0;
    for (int b = 7; b >= 0; --b) v = v << 8 | std::stoul(hex.substr(static_cast<std::size_t>(b) * 2, 2), nullptr, 16);
    seen.push_back(v);
  }
  REQUIRE(seen.size() == 5);
  for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i] >= seen[i - 1]);
  CHECK(seen.back() > seen.front());
}

TEST_CASE("a buffer rewritten while peeked can tear under --live, never under --quiesce", "[emu][peek]") {
  background_process writer({cuda_ckpt, "run", "--", writer_program, "--seconds", "120"});
  REQUIRE(writer.wait_for_output("ready\n"));
  const std::string buffer = address_of(writer.output(), "cuMemAlloc");
  const std::string pid = std::to_string(writer.pid());
  scratch_dir scratch;
  const fs::path out = scratch.path / "buffer";
  auto torn = [&](const char* order) {
    const auto r = run_process({cuda_ckpt, "peek", pid, buffer, "1M", "-o", out.string(), order});
    INFO(describe(r));
    REQUIRE(r.exit_code == 0);
    const std::string bytes = file_text(out);
    REQUIRE(bytes.size() == writer_buffer_size);
    return !vmmckpt::contracts::busy_problem(reinterpret_cast<const std::uint64_t*>(bytes.data()), bytes.size() / 8)
                .empty();
  };
  for (int i = 0; i < 10; ++i) CHECK_FALSE(torn("--quiesce"));
  int live_torn = 0;
  for (int i = 0; i < 20 && live_torn == 0; ++i) live_torn += torn("--live") ? 1 : 0;
  // Possible, not certain: on a loaded machine the writer may not run during a copy.
  if (live_torn == 0) WARN("no --live peek of 20 came out torn");
}

TEST_CASE("peek reads program-made VMM memory by copy and by map, the bytes a dump of it holds", "[emu][peek][vmm]") {
  scratch_dir dir;
  background_process program({cuda_ckpt, "run", "--", programs + "emu_vmm_checkpointed", dir.path.string()});
  REQUIRE(program.wait_for_output("ready\n"));
  const std::string pid = std::to_string(program.pid());
  auto r = run_process({cuda_ckpt, "peek", pid, "--list", "--json"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  const auto last = nlohmann::json::parse(r.out)["allocations"].back();  // a 16 MiB mapping of its own
  REQUIRE(last["api"] == "cuMemMap");
  const std::string addr = last["addr"], size = std::to_string(last["size"].get<std::uint64_t>());
  std::map<std::string, std::string> seen;
  for (const char* via : {"copy", "map"}) {
    const fs::path out = dir.path / via;
    r = run_process({cuda_ckpt, "peek", pid, addr, size, "--via", via, "--ordered", "-o", out.string()});
    INFO(via << "\n" << describe(r));
    REQUIRE(r.exit_code == 0);
    seen[via] = file_text(out);
  }
  CHECK(seen["copy"].size() == last["size"].get<std::uint64_t>());
  CHECK(seen["copy"] == seen["map"]);
  // A part of the mapping by map, from an offset into it.
  std::ostringstream inside;
  inside << "0x" << std::hex << std::stoull(addr, nullptr, 16) + 4096;
  r = run_process({cuda_ckpt, "peek", pid, inside.str(), "4096", "--via", "map", "-o", (dir.path / "part").string()});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  CHECK(file_text(dir.path / "part") == seen["copy"].substr(4096, 4096));
  const fs::path image = dir.path / "image";
  REQUIRE(run_process({cuda_ckpt, "dump", pid, "-o", image.string()}, {}, 120).exit_code == 0);
  r = run_process({cuda_ckpt, "cat", image.string(), addr, size});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == seen["map"]);
  std::ofstream(dir.path / "finish").put('\n');
  REQUIRE(program.wait_for_output("done\n"));
}
