// CPU-only benchmark of placement: allocate/free pair latency of the range allocator and the pool logic,
// and the physical memory the pool logic holds under bench/frag.cu's fragmenting pattern (one JSON line,
// as frag.cu prints it, with "mode":"pool logic"), so that placement changes can be compared anywhere.
// Then the pair latency from several threads at once on one pool (bench/alloc.cu's pattern, without the
// driver), one JSON line per (size, threads):
//   {"bench":"allocator_threads","size":S,"threads":T,"pairs":N,"median_ns":..,"p99_ns":..,"mean_ns":..,
//    "pairs_per_s":..}
// pairs is per thread; the statistics are over all threads' pairs together; pairs_per_s is all threads'
// pairs over the wall time. With more threads than
// cores, a thread preempted while it holds a lock stalls the others for a scheduler tick, which the
// p99 shows; with fewer cores than threads the median understates contention (threads take turns).
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

#include "frag_pattern.hpp"
#include "vmmckpt/pool/device_pool.hpp"

namespace {

class null_backend final : public vmmckpt::physical_backend {
 public:
  int map_segment(std::uint64_t, std::uint64_t, std::uint64_t& handle) override {
    handle = 1;
    return 0;
  }
  void unmap_segment(std::uint64_t, std::uint64_t, std::uint64_t) override {}
  void synchronize() override {}
  std::uint64_t submitted_work() const override { return 0; }
  bool is_out_of_memory(int) const override { return false; }
};

// Counts the bytes mapped, as the device would hold them.
class counting_backend final : public vmmckpt::physical_backend {
 public:
  int map_segment(std::uint64_t, std::uint64_t size, std::uint64_t& handle) override {
    mapped += size;
    handle = 1;
    return 0;
  }
  void unmap_segment(std::uint64_t, std::uint64_t size, std::uint64_t) override { mapped -= size; }
  void synchronize() override {}
  std::uint64_t submitted_work() const override { return 0; }
  bool is_out_of_memory(int) const override { return false; }
  std::uint64_t mapped = 0;
};

void fragmentation() {
  counting_backend backend;
  vmmckpt::pool_policy policy;
  vmmckpt::device_pool pool(0x200000000000ULL, 512ULL << 30, policy, backend);
  std::uint64_t peak_live = 0, peak_physical = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  const long steps = 20000;
  const std::uint64_t live_bytes = bench::run_frag_pattern<std::uint64_t>(
      8ULL << 30, steps, 42,
      [&](std::uint64_t size) {
        std::uint64_t a = 0;
        pool.allocate(size, vmmckpt::alloc_api::cuda_malloc, a);
        return a;
      },
      [&](std::uint64_t a) { pool.free(a); },
      [&](std::uint64_t live_now) {
        if (backend.mapped >= peak_physical) {
          peak_physical = backend.mapped;
          peak_live = live_now;
        }
      },
      live);
  std::printf("{\"bench\":\"frag\",\"mode\":\"pool logic\",\"live_bytes\":%llu,\"physical_bytes\":%llu,"
              "\"ratio\":%.4f,\"peak_live_bytes\":%llu,\"peak_physical_bytes\":%llu,\"peak_ratio\":%.4f,"
              "\"blocks\":%zu,\"steps\":%ld,\"memory_source\":\"mapped bytes\"}\n",
              static_cast<unsigned long long>(live_bytes), static_cast<unsigned long long>(backend.mapped),
              static_cast<double>(backend.mapped) / static_cast<double>(live_bytes),
              static_cast<unsigned long long>(peak_live), static_cast<unsigned long long>(peak_physical),
              peak_live > 0 ? static_cast<double>(peak_physical) / static_cast<double>(peak_live) : 0.0, live.size(),
              steps);
}

// Every thread's per-pair latencies in nanoseconds, all threads starting together on one pool.
// wall_s: from the start (all threads released together) until the last thread finished.
std::vector<double> time_pairs(vmmckpt::device_pool& pool, std::uint64_t size, int threads, int pairs, double& wall_s) {
  std::vector<std::vector<double>> per_thread(threads);
  std::chrono::steady_clock::time_point started;
  std::barrier start(threads, [&]() noexcept { started = std::chrono::steady_clock::now(); });
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto pair = [&] {
        std::uint64_t a = 0;
        pool.allocate(size, vmmckpt::alloc_api::cuda_malloc, a);
        pool.free(a);
      };
      for (int i = 0; i < pairs / 10; ++i) pair();
      auto& mine = per_thread[t];
      mine.reserve(pairs);
      start.arrive_and_wait();
      for (int i = 0; i < pairs; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        pair();
        mine.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
      }
    });
  }
  for (auto& w : workers) w.join();
  wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::vector<double> all;
  for (auto& v : per_thread) all.insert(all.end(), v.begin(), v.end());
  return all;
}

double quantile(const std::vector<double>& sorted, double q) {
  const auto i = static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

void threaded_pairs() {
  null_backend backend;
  vmmckpt::pool_policy policy;
  vmmckpt::device_pool pool(0x200000000000ULL, 512ULL << 30, policy, backend);
  for (std::uint64_t size : {256ULL, 4096ULL, 64ULL << 10, 1ULL << 20}) {
    for (int threads : {1, 2, 8}) {
      constexpr int pairs = 100000;
      double wall_s = 0;
      std::vector<double> ns = time_pairs(pool, size, threads, pairs, wall_s);
      std::sort(ns.begin(), ns.end());
      const double mean = std::accumulate(ns.begin(), ns.end(), 0.0) / static_cast<double>(ns.size());
      std::printf("{\"bench\":\"allocator_threads\",\"size\":%llu,\"threads\":%d,\"pairs\":%d,\"median_ns\":%.1f,"
                  "\"p99_ns\":%.1f,\"mean_ns\":%.1f,\"pairs_per_s\":%.0f}\n",
                  static_cast<unsigned long long>(size), threads, pairs, quantile(ns, 0.5), quantile(ns, 0.99), mean,
                  static_cast<double>(threads) * pairs / wall_s);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main() {
  null_backend backend;
  vmmckpt::pool_policy policy;
  vmmckpt::device_pool pool(0x200000000000ULL, 512ULL << 30, policy, backend);
  std::vector<std::uint64_t> background;
  for (int i = 0; i < 10000; ++i) {  // a populated pool, as in a real program
    std::uint64_t a = 0;
    pool.allocate(4096 + (i % 7) * 1000, vmmckpt::alloc_api::cuda_malloc, a);
    if (i % 3 == 0) background.push_back(a);
  }
  for (auto a : background) pool.free(a);
  std::printf("%-12s %14s\n", "size", "pair (ns)");
  for (std::uint64_t size : {256ULL, 4096ULL, 1ULL << 20, 64ULL << 20, 1ULL << 30}) {
    constexpr int rounds = 200000;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      std::uint64_t a = 0;
      pool.allocate(size, vmmckpt::alloc_api::cuda_malloc, a);
      pool.free(a);
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    std::printf("%-12llu %14.1f\n", static_cast<unsigned long long>(size), ns / rounds);
  }
  fragmentation();
  threaded_pairs();
  return 0;
}
