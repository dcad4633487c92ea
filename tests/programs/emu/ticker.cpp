// Emulator test program for whole-process checkpoints: GPU and CPU state that must go on together.
//
// Every tick checks that each buffer holds the previous tick's value (read back from the device), writes
// this tick's, and appends "tick T" to LOG: after a whole-process restore the ticks go on from where they
// were, with every buffer still matching the CPU's counter. Ends when LOG.stop appears ("stopped at T",
// exit 0); a mismatch is logged ("BAD ...", exit 3).
//
// usage: emu_ticker LOG [--buffers N] [--size BYTES] [--still BYTES] [--children K] [--bare-child]
//   --still BYTES  one more buffer, written once and checked every 25 ticks and at the stop: memory an
//                  incremental checkpoint leaves to its parent
//   --children K   first starts K copies of itself (LOG.1 ... LOG.K), under the shim as it is: a process tree
//   --bare-child   first starts one copy without the shim (LD_PRELOAD removed) that uses CUDA: LOG.bare
#include <cuda.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/cuda_check.hpp"

extern char** environ;

namespace {

std::uint32_t value(std::uint64_t tick, int buffer) {
  return static_cast<std::uint32_t>(tick * 2654435761u) ^ static_cast<std::uint32_t>((buffer + 1) * 40503u);
}

pid_t start_copy(const char* self, const std::string& log, int buffers, std::size_t size, bool bare) {
  std::vector<std::string> args{self, log, "--buffers", std::to_string(buffers), "--size", std::to_string(size)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (!bare || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.push_back(*e);
  env.push_back(nullptr);
  pid_t child = 0;
  if (posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv.data(), env.data()) != 0) {
    std::perror("posix_spawn");
    std::exit(2);
  }
  return child;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: emu_ticker LOG [--buffers N] [--size BYTES] [--children K] [--bare-child]\n");
    return 2;
  }
  // Like a daemon, close what was inherited (a test runner's open log, say): CRIU restores every open
  // file and refuses one whose size changed meanwhile.
  ::close_range(3, ~0U, 0);
  const std::string log_path = argv[1];
  int buffers = 4, children = 0;
  std::size_t size = 1 << 20, still_size = 0;
  bool bare_child = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--buffers" && i + 1 < argc)
      buffers = std::atoi(argv[++i]);
    else if (a == "--size" && i + 1 < argc)
      size = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--still" && i + 1 < argc)
      still_size = std::strtoull(argv[++i], nullptr, 10) / 4 * 4;
    else if (a == "--children" && i + 1 < argc)
      children = std::atoi(argv[++i]);
    else if (a == "--bare-child")
      bare_child = true;
    else {
      std::fprintf(stderr, "emu_ticker: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  for (int k = 1; k <= children; ++k) start_copy(argv[0], log_path + "." + std::to_string(k), buffers, size, false);
  if (bare_child) start_copy(argv[0], log_path + ".bare", buffers, size, true);

  FILE* log = std::fopen(log_path.c_str(), "a");
  if (log == nullptr) {
    std::perror(log_path.c_str());
    return 2;
  }
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  const std::size_t words = size / 4;
  std::vector<CUdeviceptr> ptrs(buffers);
  for (int b = 0; b < buffers; ++b) {
    VMMCKPT_CHECK(cuMemAlloc(&ptrs[b], size));
    VMMCKPT_CHECK(cuMemsetD32(ptrs[b], value(0, b), words));
  }
  std::vector<std::uint32_t> host(words);
  std::vector<std::uint32_t> still(still_size / 4);
  for (std::size_t i = 0; i < still.size(); ++i) still[i] = static_cast<std::uint32_t>(i * 2654435761u) ^ 0x5a5a5a5au;
  CUdeviceptr still_ptr = 0;
  if (!still.empty()) {
    VMMCKPT_CHECK(cuMemAlloc(&still_ptr, still_size));
    VMMCKPT_CHECK(cuMemcpyHtoD(still_ptr, still.data(), still_size));
  }
  std::vector<std::uint32_t> still_back(still.size());
  auto still_holds = [&](std::uint64_t tick) {
    if (still.empty()) return true;
    VMMCKPT_CHECK(cuMemcpyDtoH(still_back.data(), still_ptr, still_size));
    if (still_back == still) return true;
    std::fprintf(log, "BAD tick %llu: the still buffer changed\n", static_cast<unsigned long long>(tick));
    std::fflush(log);
    return false;
  };
  const std::string stop_path = log_path + ".stop";
  for (std::uint64_t tick = 1;; ++tick) {
    for (int b = 0; b < buffers; ++b) {
      VMMCKPT_CHECK(cuMemcpyDtoH(host.data(), ptrs[b], size));
      for (std::size_t i = 0; i < words; ++i) {
        if (host[i] != value(tick - 1, b)) {
          std::fprintf(log, "BAD tick %llu buffer %d word %zu: 0x%08x, want 0x%08x\n",
                       static_cast<unsigned long long>(tick), b, i, host[i], value(tick - 1, b));
          std::fflush(log);
          return 3;
        }
      }
      VMMCKPT_CHECK(cuMemsetD32(ptrs[b], value(tick, b), words));
    }
    VMMCKPT_CHECK(cuCtxSynchronize());
    std::fprintf(log, "tick %llu\n", static_cast<unsigned long long>(tick));
    std::fflush(log);
    if (tick % 25 == 0 && !still_holds(tick)) return 3;
    if (::access(stop_path.c_str(), F_OK) == 0) {
      if (!still_holds(tick)) return 3;
      std::fprintf(log, "stopped at %llu\n", static_cast<unsigned long long>(tick));
      std::fclose(log);
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}
