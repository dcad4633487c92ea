// End-to-end tests of program-made VMM memory under the shim: PyTorch's, NCCL's, vLLM's and XLA's ways.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "e2e_support.hpp"

using vmmckpt::test::build_dir;
using vmmckpt::test::describe;
using vmmckpt::test::process_result;
using vmmckpt::test::programs;
using vmmckpt::test::run_process;
using vmmckpt::test::shim;

namespace {

// docs/vmm.md: device d's window is [base + d * window, + window).
constexpr unsigned long long window_base = 0x300000000000ULL;
constexpr unsigned long long window_size = 2ULL << 40;
constexpr unsigned long long token_tag = 0x766d6dULL;

struct reserved {
  unsigned long long addr = 0, size = 0;
};

// The `ptr` and `token` lines a program printed, in order: what must be the same in every run.
struct vmm_lines {
  std::vector<reserved> reservations;
  std::vector<unsigned long long> tokens;
  std::vector<std::string> lines;
};

vmm_lines parse(const std::string& out) {
  vmm_lines v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "ptr") {
      reserved r;
      fields >> std::hex >> r.addr >> std::dec >> r.size;
      v.reservations.push_back(r);
    } else if (kind == "token") {
      unsigned long long t = 0;
      fields >> std::hex >> t;
      v.tokens.push_back(t);
    } else {
      continue;
    }
    v.lines.push_back(line);
  }
  return v;
}

process_result run_under_shim(const std::vector<std::string>& argv, std::map<std::string, std::string> env = {}) {
  env.emplace("LD_PRELOAD", shim);
  return run_process(argv, env);
}

// Runs a program twice under the shim: both succeed, every reservation lies in device 0's window, the
// first opens it, every handle the program saw is a token, and both runs print the same lines.
vmm_lines require_deterministic_in_window(const std::string& program) {
  const auto first = run_under_shim({programs + program});
  INFO(describe(first));
  REQUIRE(first.exit_code == 0);
  REQUIRE(first.out.find("done") != std::string::npos);
  const vmm_lines lines = parse(first.out);
  REQUIRE_FALSE(lines.reservations.empty());
  REQUIRE(lines.reservations.front().addr == window_base);
  for (const auto& r : lines.reservations) {
    INFO("reservation 0x" << std::hex << r.addr);
    REQUIRE(r.addr >= window_base);
    REQUIRE(r.addr + r.size <= window_base + window_size);
  }
  REQUIRE_FALSE(lines.tokens.empty());
  for (unsigned long long t : lines.tokens) REQUIRE((t >> 40) == token_tag);
  const auto second = run_under_shim({programs + program});
  INFO(describe(second));
  REQUIRE(second.exit_code == 0);
  REQUIRE(parse(second.out).lines == lines.lines);
  return lines;
}

}  // namespace

TEST_CASE("vmm: PyTorch's expandable segments get window addresses and tokens, the same in two runs", "[emu][vmm]") {
  const vmm_lines lines = require_deterministic_in_window("emu_vmm_expandable");
  // Two segments of 1.125 x device memory, the second right after the first; 10 handles, counted 1 to 10.
  REQUIRE(lines.reservations.size() == 2);
  REQUIRE(lines.reservations[1].addr ==
          window_base + (lines.reservations[0].size + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  REQUIRE(lines.tokens.size() == 10);
  for (std::size_t i = 0; i < lines.tokens.size(); ++i) REQUIRE((lines.tokens[i] & 0xffffffffffULL) == i + 1);
}

TEST_CASE("vmm: NCCL's buffer is exported by its raw handle value and read by another process", "[emu][vmm]") {
  const vmm_lines lines = require_deterministic_in_window("emu_vmm_nccl");
  // Parent and child each reserve once (the child in its own fresh window); the child's import is the
  // driver's own handle, passed through.
  REQUIRE(lines.reservations.size() == 2);
  REQUIRE(lines.reservations[1].addr == window_base);
  const auto r = run_under_shim({programs + "emu_vmm_nccl"});
  REQUIRE(r.out.find("child imported a driver handle: yes") != std::string::npos);
  REQUIRE(r.out.find("parent sees the child's bytes") != std::string::npos);
}

TEST_CASE("vmm: vLLM's sleep and wake-up map new memory at the same addresses", "[emu][vmm]") {
  const vmm_lines lines = require_deterministic_in_window("emu_vmm_sleep");
  REQUIRE(lines.reservations.size() == 3);
  REQUIRE(lines.tokens.size() == 9);  // 3 buffers, created again at each of 2 wake-ups
}

TEST_CASE("vmm: the VMM functions looked up on the program's own libcuda handle are the shim's", "[emu][vmm]") {
  require_deterministic_in_window("emu_vmm_dlopen");
  const auto r = run_under_shim({programs + "emu_vmm_dlopen"});
  REQUIRE(r.out.find("mismatches 0") != std::string::npos);
}

TEST_CASE("vmm: VMMCKPT_VMM_BASE moves the windows", "[emu][vmm]") {
  // Not 0x600000000000: AddressSanitizer's allocator lives there (scripts/sanitize.sh asan).
  const auto r = run_under_shim({programs + "emu_vmm_sleep"}, {{"VMMCKPT_VMM_BASE", "0x440000000000"}});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  const vmm_lines lines = parse(r.out);
  REQUIRE(lines.reservations.size() == 3);
  REQUIRE(lines.reservations.front().addr == 0x440000000000ULL);
}

TEST_CASE("vmm: a window range taken in the process fails the reservation, naming the variable", "[emu][vmm]") {
  const auto r = run_under_shim({programs + "emu_vmm_sleep", "--window-taken"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("result CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  REQUIRE(r.err.find("VMMCKPT_VMM_BASE") != std::string::npos);
}

TEST_CASE("vmm: a bad window setting fails reservations and leaves the pools alone", "[emu][vmm]") {
  const auto r = run_under_shim({programs + "emu_vmm_sleep", "--window-taken"}, {{"VMMCKPT_VMM_WINDOW", "3M"}});
  INFO(describe(r));
  REQUIRE(r.out.find("result CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  REQUIRE(r.err.find("VMMCKPT_VMM_WINDOW") != std::string::npos);
  // The pool's own allocations still work with the same setting.
  const auto pool = run_under_shim({programs + "emu_driver_alloc"}, {{"VMMCKPT_VMM_WINDOW", "3M"}});
  INFO(describe(pool));
  REQUIRE(pool.exit_code == 0);
}

TEST_CASE("vmm: a forked child steps aside: the parent's tokens reach the driver as they are", "[emu][vmm]") {
  const auto r = run_under_shim({programs + "emu_vmm_sleep", "--fork"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("child release of the parent's token: CUDA_ERROR_NOT_INITIALIZED") != std::string::npos);
  REQUIRE(parse(r.out).reservations.front().addr == window_base);
}

TEST_CASE("vmm: segments grown and emptied by 8 threads at once all succeed and give every handle back", "[emu][vmm]") {
  const auto r = run_under_shim({programs + "emu_vmm_expandable", "--threads"});
  INFO(describe(r));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("threads: 0 failures, free memory back") != std::string::npos);
}
