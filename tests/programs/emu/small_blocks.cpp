// Emulator test program: many small blocks with gaps between them, each holding its own pattern.
//
//   small_blocks [--count N] [--size BYTES] [--large L]
//                                             allocate N blocks of BYTES each, then L of large_size bytes, fill
//                                             them, print `ready`, then wait for signals until killed:
//     SIGUSR1  allocate one more block (grown_size bytes), fill it, print `grown 0x<addr> <bytes>`
//     SIGUSR2  read every block back, print `check ok <blocks>` or `check bad 0x<addr>`
//
// The pool places small blocks 512 bytes apart, so blocks of 200 bytes leave gaps that an image does not
// store: a dump packs many blocks into each extent, and restore and resume put each one back in its place.
#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/cuda_check.hpp"

namespace {

constexpr std::size_t grown_size = 12345;
constexpr std::size_t large_size = 2 << 20;  // two blocks of an image, a multiple of the pool's granularity

int g_signal_pipe[2];

void on_signal(int sig) {
  const char c = sig == SIGUSR1 ? 'g' : 'c';
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}

unsigned char pattern(std::size_t block, std::size_t k) { return static_cast<unsigned char>(block * 131 + k * 7 + 1); }

struct block {
  CUdeviceptr addr;
  std::size_t size;
};

block allocate(std::size_t index, std::size_t size) {
  block b{0, size};
  VMMCKPT_CHECK(cuMemAlloc(&b.addr, size));
  std::vector<unsigned char> bytes(size);
  for (std::size_t k = 0; k < size; ++k) bytes[k] = pattern(index, k);
  VMMCKPT_CHECK(cuMemcpyHtoD(b.addr, bytes.data(), size));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t count = 3000, size = 200, large = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--count") count = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--size") size = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--large") large = std::strtoull(argv[i + 1], nullptr, 10);
  }
  if (::pipe(g_signal_pipe) != 0) return 1;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGUSR2, &sa, nullptr);

  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  std::vector<block> blocks;
  for (std::size_t i = 0; i < count; ++i) blocks.push_back(allocate(i, size));
  for (std::size_t i = 0; i < large; ++i) blocks.push_back(allocate(blocks.size(), large_size));
  std::printf("ready\n");
  std::fflush(stdout);

  for (;;) {
    char c = 0;
    if (::read(g_signal_pipe[0], &c, 1) != 1) continue;
    if (c == 'g') {
      blocks.push_back(allocate(blocks.size(), grown_size));
      std::printf("grown 0x%llx %zu\n", static_cast<unsigned long long>(blocks.back().addr), grown_size);
    } else {
      std::string verdict = "check ok " + std::to_string(blocks.size());
      std::vector<unsigned char> bytes;
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        bytes.resize(blocks[i].size);
        VMMCKPT_CHECK(cuMemcpyDtoH(bytes.data(), blocks[i].addr, blocks[i].size));
        for (std::size_t k = 0; k < bytes.size(); ++k)
          if (bytes[k] != pattern(i, k)) {
            char at[32];
            std::snprintf(at, sizeof at, "0x%llx", static_cast<unsigned long long>(blocks[i].addr));
            verdict = std::string("check bad ") + at;
            break;
          }
        if (verdict.rfind("check bad", 0) == 0) break;
      }
      std::printf("%s\n", verdict.c_str());
    }
    std::fflush(stdout);
  }
}
