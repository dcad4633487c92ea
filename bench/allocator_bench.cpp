// CPU-only benchmark of placement: allocate/free pair latency of the range allocator and the pool logic.
#include <chrono>
#include <cstdio>
#include <vector>

#include "vmmckpt/device_pool.hpp"

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
  return 0;
}
