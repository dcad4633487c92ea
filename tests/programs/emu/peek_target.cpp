// Emulator test program for cuda-ckpt peek and poke: memory a reader looks at while the program runs.
//
// A 4 KiB buffer of bytes i % 251, named "pattern" (vmmckpt_name), and a counter buffer whose u64 the program
// rewrites every millisecond on its device. Every 10 ms it reads the pattern buffer back: once its first 8 bytes
// change (a poke), it prints "changed XXXXXXXXXXXXXXXX" (those bytes in hex). Ends after --seconds (default 60).
//
// Prints "ptr ADDR SIZE pattern", "ptr ADDR SIZE counter", then "ready".
#include <cuda.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

int main(int argc, char** argv) {
  int seconds = 60;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atoi(argv[i + 1]);
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  constexpr std::size_t size = 4096;
  unsigned char pattern[size];
  for (std::size_t i = 0; i < size; ++i) pattern[i] = static_cast<unsigned char>(i % 251);
  CUdeviceptr buffer = 0, counter = 0;
  VMMCKPT_CHECK(cuMemAlloc(&buffer, size));
  VMMCKPT_CHECK(cuMemcpyHtoD(buffer, pattern, size));
  VMMCKPT_CHECK(cuMemAlloc(&counter, 4096));
  VMMCKPT_CHECK(cuMemsetD8(counter, 0, 4096));
  using name_fn = int (*)(const void*, std::uint64_t, const char*);
  if (auto name = reinterpret_cast<name_fn>(dlsym(RTLD_DEFAULT, "vmmckpt_name")))
    if (name(reinterpret_cast<const void*>(buffer), size, "pattern") != 0) return 4;
  vmmckpt::contracts::print_ptr(buffer, size, "pattern");
  vmmckpt::contracts::print_ptr(counter, 4096, "counter");
  std::printf("ready\n");
  std::fflush(stdout);

  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::uint64_t count = 0;
  bool changed = false;
  while (std::chrono::steady_clock::now() < stop_at) {
    for (int k = 0; k < 10; ++k) {
      ++count;
      VMMCKPT_CHECK(cuMemcpyHtoD(counter, &count, sizeof count));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    unsigned char now[8];
    VMMCKPT_CHECK(cuMemcpyDtoH(now, buffer, sizeof now));
    if (!changed && std::memcmp(now, pattern, sizeof now) != 0) {
      changed = true;
      std::printf("changed ");
      for (unsigned char c : now) std::printf("%02x", c);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
