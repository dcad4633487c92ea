// Emulator test program for incremental dumps (tests/emu/incremental_e2e_test.cpp): memory that changes a little between dumps.
//
//   incremental run DIR     allocate 4 blocks of 25 MiB, fill them, save their bytes to DIR/live-0, print
//                           `ready`; on each SIGUSR1 change 1 % of the memory (one byte in every 100th MiB),
//                           save the bytes to DIR/live-K and print `changed K`; exit on SIGTERM
//   incremental run-sparse DIR
//                           the same memory, zeros but for its first MiB of each allocation (written as zeros,
//                           not left as the driver gave it); on each SIGUSR1 zero the first MiB of the first
//                           allocation and write one byte into a zero MiB of the second
//   incremental check FILE  (restored from an image) its memory at FILE's addresses holds FILE's bytes: prints
//                           `equal: N bytes` and exits 0, or names the first difference and exits 1
//
// FILE: for each allocation, u64 address, u64 size (host order), then its bytes.
#include <cuda.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "support/cuda_check.hpp"

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t allocation_size = 25 * MiB;
constexpr int allocations = 4;

void init_cuda() {
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
}

void save(const std::vector<CUdeviceptr>& blocks, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::vector<unsigned char> bytes(allocation_size);
  for (CUdeviceptr p : blocks) {
    VMMCKPT_CHECK(cuMemcpyDtoH(bytes.data(), p, allocation_size));
    const std::uint64_t head[2] = {p, allocation_size};
    out.write(reinterpret_cast<const char*>(head), sizeof head);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  if (!out.flush()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

int run(const std::string& dir, bool sparse) {
  // Blocked before any thread exists, so that sigwait below is the only one that takes them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  init_cuda();
  std::vector<CUdeviceptr> blocks(allocations);
  std::mt19937_64 rng(19);
  std::vector<unsigned char> bytes(allocation_size);
  for (auto& p : blocks) {
    VMMCKPT_CHECK(cuMemAlloc(&p, allocation_size));
    for (std::uint64_t k = 0; k < allocation_size; ++k)
      bytes[k] = sparse && k >= MiB ? 0 : static_cast<unsigned char>(rng());
    VMMCKPT_CHECK(cuMemcpyHtoD(p, bytes.data(), allocation_size));
  }
  save(blocks, dir + "/live-0");
  std::printf("ready\n");
  std::fflush(stdout);
  for (int round = 1;; ++round) {
    int sig = 0;
    sigwait(&set, &sig);
    if (sig == SIGTERM) return 0;
    if (sparse) {
      // A block written and then zeroed again, and a zero block written.
      const std::vector<unsigned char> zeros(MiB, 0);
      VMMCKPT_CHECK(cuMemcpyHtoD(blocks[0], zeros.data(), MiB));
      const unsigned char b = 0x77;
      VMMCKPT_CHECK(cuMemcpyHtoD(blocks[1] + 10 * MiB + static_cast<std::uint64_t>(round), &b, 1));
      save(blocks, dir + "/live-" + std::to_string(round));
      std::printf("changed %d\n", round);
      std::fflush(stdout);
      continue;
    }
    // One byte in every 100th MiB of the memory, a different byte each round.
    for (std::uint64_t at = static_cast<std::uint64_t>(round) * 7 * MiB % (100 * MiB);
         at < allocations * allocation_size; at += 100 * MiB) {
      const CUdeviceptr p = blocks[at / allocation_size] + at % allocation_size + static_cast<std::uint64_t>(round);
      unsigned char b = 0;
      VMMCKPT_CHECK(cuMemcpyDtoH(&b, p, 1));
      b ^= 0x5a;
      VMMCKPT_CHECK(cuMemcpyHtoD(p, &b, 1));
    }
    save(blocks, dir + "/live-" + std::to_string(round));
    std::printf("changed %d\n", round);
    std::fflush(stdout);
  }
}

int check(const std::string& path) {
  init_cuda();
  CUdeviceptr probe = 0;  // the image comes back at the process's first memory call
  VMMCKPT_CHECK(cuMemAlloc(&probe, 4096));
  std::ifstream in(path, std::ios::binary);
  std::uint64_t head[2], total = 0;
  std::vector<unsigned char> want, got;
  while (in.read(reinterpret_cast<char*>(head), sizeof head)) {
    want.resize(head[1]);
    got.resize(head[1]);
    in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(head[1]));
    VMMCKPT_CHECK(cuMemcpyDtoH(got.data(), head[0], head[1]));
    for (std::uint64_t k = 0; k < head[1]; ++k)
      if (got[k] != want[k]) {
        std::printf("differs at 0x%llx: 0x%02x, the live process had 0x%02x\n",
                    static_cast<unsigned long long>(head[0] + k), got[k], want[k]);
        return 1;
      }
    total += head[1];
  }
  if (total == 0) {
    std::printf("%s holds no bytes\n", path.c_str());
    return 1;
  }
  std::printf("equal: %llu bytes\n", static_cast<unsigned long long>(total));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "run") return run(argv[2], false);
  if (argc == 3 && std::string(argv[1]) == "run-sparse") return run(argv[2], true);
  if (argc == 3 && std::string(argv[1]) == "check") return check(argv[2]);
  std::fprintf(stderr, "usage: %s run DIR | run-sparse DIR | check FILE\n", argv[0]);
  return 2;
}
