// The fragmenting allocation pattern of the pool-overhead benchmark, shared by bench/frag.cu (on a GPU,
// natively or under the shim) and bench/allocator_bench.cpp (the pool's logic alone, on any machine).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace bench {

// splitmix64: the same sequence on every machine and compiler (std:: distributions are not).
struct frag_rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t x = (state += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  std::uint64_t size() {  // log-uniform from 4 KiB to 64 MiB
    static const double lo = std::log(4096.0), hi = std::log(64.0 * (1 << 20));
    return static_cast<std::uint64_t>(std::exp(lo + uniform() * (hi - lo)));
  }
};

// Allocates until live_bytes reaches `target`, then `steps` times frees a random live block and
// allocates a new one. allocate(size) returns a handle, release(handle) frees it; sample() is called
// after the rise and every 500 steps. Returns the live bytes at the end; `live` holds what is left.
template <typename Handle, typename Allocate, typename Release, typename Sample>
std::uint64_t run_frag_pattern(std::uint64_t target, long steps, std::uint64_t seed, Allocate allocate, Release release,
                               Sample sample, std::vector<std::pair<Handle, std::uint64_t>>& live) {
  frag_rng r{seed};
  std::uint64_t live_bytes = 0;
  auto add = [&] {
    const std::uint64_t size = r.size();
    live.emplace_back(allocate(size), size);
    live_bytes += size;
  };
  while (live_bytes < target) add();
  sample(live_bytes);
  for (long step = 1; step <= steps; ++step) {
    const std::size_t victim = r.next() % live.size();
    release(live[victim].first);
    live_bytes -= live[victim].second;
    live[victim] = live.back();
    live.pop_back();
    add();
    if (step % 500 == 0) sample(live_bytes);
  }
  return live_bytes;
}

}  // namespace bench
