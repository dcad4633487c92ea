// What the block size of incremental images costs and saves (docs/image-format.md, "Blocks"): hashing speed per
// block size on this CPU, the block table per 32 GiB, and the bytes an incremental dump writes when scattered
// bytes change.
//
//   vmmckpt_bench_block_size [MiB of data, default 256]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "vmmckpt/image/image.hpp"

int main(int argc, char** argv) {
  const std::uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  std::vector<unsigned char> data(mib << 20);
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i < data.size(); i += 8) {
    const std::uint64_t r = rng();
    for (int k = 0; k < 8 && i + k < data.size(); ++k) data[i + k] = static_cast<unsigned char>(r >> (8 * k));
  }
  const std::uint64_t live = 32ULL << 30;
  std::printf("%10s %12s %14s %14s %16s\n", "block", "hash GB/s", "blocks/32GiB", "table/32GiB", "1% scattered");
  for (std::uint64_t block = 4 << 10; block <= (16ULL << 20); block *= 4) {
    double best = 1e9;
    std::uint64_t sink = 0;
    for (int round = 0; round < 3; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      for (std::uint64_t at = 0; at < data.size(); at += block)
        sink ^= vmmckpt::image::block_checksum(data.data() + at, std::min<std::uint64_t>(block, data.size() - at));
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const std::uint64_t blocks = live / block;
    // One byte changed in every 100th MiB, as the e2e test and the "1 % changed" measure: each
    // touches one block, so an incremental dump writes (changes) x block bytes.
    const std::uint64_t changes = live / (100ULL << 20);
    std::printf("%9lluK %12.2f %14llu %13.1fM %15.1fM%s\n", static_cast<unsigned long long>(block >> 10),
                static_cast<double>(data.size()) / best / 1e9, static_cast<unsigned long long>(blocks),
                static_cast<double>(blocks * 16) / (1 << 20), static_cast<double>(changes * block) / (1 << 20),
                sink == 42 ? " " : "");
  }
  return 0;
}
