// cudaMalloc + cudaFree pair latency, per size and number of threads: run natively and under the
// shim, it shows what serving allocations from the pool costs (or saves).
//
//   vmmckpt_bench_alloc [--sizes 256,4096,...] [--threads 1,8] [--scale F]
//
// Each thread times its own pairs (steady_clock around one cudaMalloc and its cudaFree) after a
// warm-up; pairs per thread: 20000 up to 1 MiB, 2000 up to 16 MiB, 200 up to 256 MiB, 50 above,
// times --scale (at least 20). One JSON line per (size, threads):
//   {"bench":"alloc","size":S,"threads":T,"pairs":N,"median_us":..,"p99_us":..,"mean_us":..}
// where pairs is per thread; the statistics are over all threads' pairs together.
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"

namespace {

__global__ void warm_kernel(int* p) { *p = 1; }

int pairs_for(std::uint64_t size, double scale) {
  const int base = size <= (1ULL << 20) ? 20000 : size <= (16ULL << 20) ? 2000 : size <= (256ULL << 20) ? 200 : 50;
  return std::max(20, static_cast<int>(std::lround(base * scale)));
}

// Every thread's per-pair latencies in microseconds, all threads starting together.
std::vector<double> time_pairs(std::uint64_t size, int threads, int pairs) {
  std::vector<std::vector<double>> per_thread(threads);
  std::barrier start(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto pair = [&] {
        void* p = nullptr;
        VMMCKPT_CHECK(cudaMalloc(&p, size));
        VMMCKPT_CHECK(cudaFree(p));
      };
      for (int i = 0; i < std::max(2, pairs / 10); ++i) pair();  // warm-up: first touches, pool growth
      auto& mine = per_thread[t];
      mine.reserve(pairs);
      start.arrive_and_wait();
      for (int i = 0; i < pairs; ++i) {
        const auto t0 = bench::clock_type::now();
        pair();
        mine.push_back(bench::seconds_since(t0) * 1e6);
      }
    });
  }
  for (auto& th : pool) th.join();
  std::vector<double> all;
  for (auto& v : per_thread) all.insert(all.end(), v.begin(), v.end());
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::uint64_t> sizes = {256, 4096, 64ULL << 10, 1ULL << 20, 16ULL << 20, 256ULL << 20, 1ULL << 30};
  std::vector<std::uint64_t> thread_counts = {1, 8};
  double scale = 1.0;
  bench::parse_options(argc, argv, [&](const std::string& a, const std::string& v) {
    if (a == "--sizes")
      sizes = bench::parse_u64_list(v);
    else if (a == "--threads")
      thread_counts = bench::parse_u64_list(v);
    else if (a == "--scale")
      scale = std::strtod(v.c_str(), nullptr);
    else
      return false;
    return true;
  });
  if (sizes.empty() || thread_counts.empty() || !(scale > 0)) bench::usage_error(argv[0], "empty list or bad --scale");

  // A warm context: creation and module loading are not part of any pair.
  int* warm = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&warm, sizeof *warm));
  warm_kernel<<<1, 1>>>(warm);
  VMMCKPT_CHECK(cudaGetLastError());
  VMMCKPT_CHECK(cudaDeviceSynchronize());
  VMMCKPT_CHECK(cudaFree(warm));

  for (const std::uint64_t size : sizes) {
    for (const std::uint64_t threads : thread_counts) {
      const int pairs = pairs_for(size, scale);
      std::vector<double> us = time_pairs(size, static_cast<int>(threads), pairs);
      std::sort(us.begin(), us.end());
      const double mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
      std::printf("{\"bench\":\"alloc\",\"size\":%llu,\"threads\":%llu,\"pairs\":%d,\"median_us\":%.3f,"
                  "\"p99_us\":%.3f,\"mean_us\":%.3f}\n",
                  static_cast<unsigned long long>(size), static_cast<unsigned long long>(threads), pairs,
                  bench::quantile(us, 0.5), bench::quantile(us, 0.99), mean);
      std::fflush(stdout);
    }
  }
  return 0;
}
