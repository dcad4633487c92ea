// End-to-end tests: real programs under the real shim on the emulated driver.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "e2e_support.hpp"

using vmmckpt::test::build_dir;
using vmmckpt::test::describe;
using vmmckpt::test::process_result;
using vmmckpt::test::programs;
using vmmckpt::test::run_process;
using vmmckpt::test::shim;

namespace {

constexpr unsigned long long default_base = 0x200000000000ULL;
constexpr unsigned long long default_size = 512ULL << 30;

struct ptr_line {
  unsigned long long addr, size;
  std::string api;
  bool operator==(const ptr_line&) const = default;
};

std::vector<ptr_line> parse_ptrs(const std::string& out) {
  std::vector<ptr_line> ptrs;
  std::istringstream in(out);
  std::string word;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("ptr ", 0) != 0) continue;
    std::istringstream fields(line.substr(4));
    ptr_line p;
    fields >> std::hex >> p.addr >> std::dec >> p.size >> p.api;
    ptrs.push_back(p);
  }
  return ptrs;
}

std::map<std::string, std::string> shim_env(std::map<std::string, std::string> extra = {}) {
  extra.emplace("LD_PRELOAD", shim);
  return extra;
}

void require_in_pool(const std::vector<ptr_line>& ptrs, unsigned long long base = default_base,
                     unsigned long long size = default_size) {
  REQUIRE_FALSE(ptrs.empty());
  for (const auto& p : ptrs) {
    INFO("ptr " << std::hex << p.addr << " (" << p.api << ")");
    REQUIRE(p.addr >= base);
    REQUIRE(p.addr + p.size <= base + size);
  }
}

std::string temp_dir() {
  char pattern[] = "/tmp/vmmckpt-test-XXXXXX";
  REQUIRE(mkdtemp(pattern) != nullptr);
  return pattern;
}

}  // namespace

TEST_CASE("driver API allocations land in the pool, at the same addresses in two runs", "[emu][shim]") {
  const auto first = run_process({programs + "emu_driver_alloc"}, shim_env());
  INFO(describe(first));
  REQUIRE(first.exit_code == 0);
  const auto ptrs = parse_ptrs(first.out);
  require_in_pool(ptrs);
  REQUIRE(ptrs.front().addr == default_base);  // the first block opens the pool
  const auto second = run_process({programs + "emu_driver_alloc"}, shim_env());
  REQUIRE(second.exit_code == 0);
  REQUIRE(parse_ptrs(second.out) == ptrs);
}

TEST_CASE("without the shim the same program is served by the driver, outside the pool", "[emu][shim]") {
  const auto r = run_process({programs + "emu_driver_alloc"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  for (const auto& p : parse_ptrs(r.out)) REQUIRE((p.addr < default_base || p.addr >= default_base + default_size));
}

// NVIDIA's libcudart refuses to run on the emulated driver (docs/emulator.md), so the
// runtime-API doors are tested on a GPU: tests/gpu (emu_runtime_alloc_* and gpu_pool_*).

TEST_CASE("dlsym and cuGetProcAddress hand out the pool's entry points", "[emu][shim]") {
  const auto r = run_process({programs + "emu_resolver_alloc"}, shim_env());
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  const auto ptrs = parse_ptrs(r.out);
  REQUIRE(ptrs.size() == 3);
  require_in_pool(ptrs);
}

TEST_CASE("VMMCKPT_POOL_BASE and VMMCKPT_POOL_SIZE move the pool", "[emu][shim]") {
  const auto r = run_process({programs + "emu_driver_alloc"},
                             shim_env({{"VMMCKPT_POOL_BASE", "0x400000000000"}, {"VMMCKPT_POOL_SIZE", "64G"}}));
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  require_in_pool(parse_ptrs(r.out), 0x400000000000ULL, 64ULL << 30);
}

TEST_CASE("a bad pool variable is named and allocations fail cleanly", "[emu][shim]") {
  const auto r = run_process({programs + "emu_driver_alloc"}, shim_env({{"VMMCKPT_POOL_BASE", "0x1234"}}));
  INFO(describe(r));
  REQUIRE(r.signal == 0);
  REQUIRE(r.exit_code == 1);  // the program's own check of cuMemAlloc failed
  REQUIRE(r.err.find("VMMCKPT_POOL_BASE") != std::string::npos);
  REQUIRE(r.err.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
}

TEST_CASE("VMMCKPT_THREAD_CACHE=0 turns the threads' caches off; a bad value is named", "[emu][shim]") {
  const auto cached = run_process({programs + "emu_driver_alloc"}, shim_env());
  const auto uncached = run_process({programs + "emu_driver_alloc"}, shim_env({{"VMMCKPT_THREAD_CACHE", "0"}}));
  INFO(describe(uncached));
  REQUIRE(cached.exit_code == 0);
  REQUIRE(uncached.exit_code == 0);  // double and interior frees refused, reuse at the same address
  // The program never frees a block before allocating its size again, so placement is the same.
  REQUIRE(parse_ptrs(uncached.out) == parse_ptrs(cached.out));
  const auto bad = run_process({programs + "emu_driver_alloc"}, shim_env({{"VMMCKPT_THREAD_CACHE", "lots"}}));
  REQUIRE(bad.exit_code == 1);
  REQUIRE(bad.err.find("VMMCKPT_THREAD_CACHE") != std::string::npos);
}

TEST_CASE("a pool range that is taken is refused, never moved", "[emu][shim]") {
  const auto r = run_process({programs + "emu_occupy_pool"}, shim_env());
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("result CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  REQUIRE(r.err.find("is taken") != std::string::npos);
}

TEST_CASE("running out of device memory is an error the program can handle", "[emu][shim]") {
  const auto r = run_process({programs + "emu_driver_alloc", "--exhaust"}, shim_env({{"VMMCKPT_EMU_MEM", "1G"}}));
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("exhausted after 4 blocks: CUDA_ERROR_OUT_OF_MEMORY") !=
          std::string::npos);  // 4 x 256 MiB = 1 GiB
  require_in_pool(parse_ptrs(r.out));
}

TEST_CASE("fork: a child of a CUDA-free parent gets the pool; a child after CUDA use neither hangs nor crashes",
          "[emu][shim]") {
  const auto before = run_process({programs + "emu_fork_alloc", "before-cuda"}, shim_env(), 60);
  INFO(describe(before));
  REQUIRE(before.exit_code == 0);
  const auto ptrs = parse_ptrs(before.out);
  REQUIRE(ptrs.size() == 2);
  require_in_pool(ptrs);
  REQUIRE(ptrs[0].addr == ptrs[1].addr);  // two fresh processes, same first address

  const auto after = run_process({programs + "emu_fork_alloc", "after-cuda"}, shim_env(), 60);
  INFO(describe(after));
  REQUIRE(after.exit_code == 0);
  REQUIRE(after.out.find("child 19 ") != std::string::npos);
  require_in_pool(parse_ptrs(after.out));
}

TEST_CASE("processes that never use CUDA are untouched", "[emu][shim]") {
  const std::string dir = temp_dir();
  const std::string log = dir + "/log";
  REQUIRE(run_process({"/bin/true"}, shim_env({{"VMMCKPT_LOG_FILE", log}, {"VMMCKPT_LOG_LEVEL", "trace"}})).exit_code ==
          0);
  // A shell lists its own threads and open files: the same with and without the shim.
  const std::string probe = "ls /proc/$$/task | wc -l; ls /proc/$$/fd; echo ok";
  const auto plain = run_process({"/bin/sh", "-c", probe});
  const auto shimmed =
      run_process({"/bin/sh", "-c", probe}, shim_env({{"VMMCKPT_LOG_FILE", log}, {"VMMCKPT_LOG_LEVEL", "trace"}}));
  INFO(describe(shimmed));
  REQUIRE(shimmed.exit_code == 0);
  REQUIRE(shimmed.out == plain.out);
  REQUIRE(shimmed.err.empty());
  REQUIRE_FALSE(std::filesystem::exists(log));  // no file opened
  // Other dynamic programs that call dlsym (python) still work.
  const auto py = run_process({"python3", "-c", "import ctypes, ctypes.util; print(ctypes.CDLL(None).strlen(b'abc'))"},
                              shim_env({{"VMMCKPT_LOG_FILE", log}}));
  INFO(describe(py));
  REQUIRE(py.exit_code == 0);
  REQUIRE(py.out == "3\n");
  REQUIRE_FALSE(std::filesystem::exists(log));
  std::filesystem::remove_all(dir);
}

TEST_CASE("logging goes to VMMCKPT_LOG_FILE at VMMCKPT_LOG_LEVEL", "[emu][shim]") {
  const std::string dir = temp_dir();
  const std::string log = dir + "/shim.log";
  const auto r = run_process({programs + "emu_driver_alloc"},
                             shim_env({{"VMMCKPT_LOG_FILE", log}, {"VMMCKPT_LOG_LEVEL", "debug"}}));
  REQUIRE(r.exit_code == 0);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  REQUIRE(text.str().find("pool of 512 GiB reserved at 0x200000000000") != std::string::npos);
  REQUIRE(text.str().find("mapped") != std::string::npos);
  // An unwritable log file is no reason to fail the program.
  const auto unwritable =
      run_process({programs + "emu_driver_alloc"},
                  shim_env({{"VMMCKPT_LOG_FILE", "/proc/no/such/dir/log"}, {"VMMCKPT_LOG_LEVEL", "debug"}}));
  REQUIRE(unwritable.exit_code == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cuda-ckpt run starts a program under the shim", "[emu][cli]") {
  const auto r = run_process({build_dir + "/bin/cuda-ckpt", "run", "--", programs + "emu_driver_alloc"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  require_in_pool(parse_ptrs(r.out));
  const auto status = run_process({build_dir + "/bin/cuda-ckpt", "run", "--", "sh", "-c", "exit 7"});
  REQUIRE(status.exit_code == 7);
  const auto missing = run_process({build_dir + "/bin/cuda-ckpt", "run", "--", "/no/such/program"});
  REQUIRE(missing.exit_code == 127);
  REQUIRE(missing.err.find("/no/such/program") != std::string::npos);
  const auto nothing = run_process({build_dir + "/bin/cuda-ckpt", "run"});
  REQUIRE(nothing.exit_code == 2);
  const auto version = run_process({build_dir + "/bin/cuda-ckpt", "--version"});
  REQUIRE(version.exit_code == 0);
  REQUIRE(version.out.find("cuda-ckpt ") == 0);
}
