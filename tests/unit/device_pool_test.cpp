// Unit tests of the pool against a simulated physical backend: growth, quarantine, trimming, OOM, threads.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "frag_pattern.hpp"
#include "vmmckpt/pool/device_pool.hpp"

using namespace vmmckpt;

namespace {

// Records [addr, addr + size) in `owners` (start -> end of every live block, from all threads); false
// when it overlaps a block already there.
bool record_disjoint(std::map<std::uint64_t, std::uint64_t>& owners, std::uint64_t addr, std::uint64_t size) {
  const auto next = owners.lower_bound(addr);
  const bool overlaps =
      (next != owners.end() && next->first < addr + size) || (next != owners.begin() && std::prev(next)->second > addr);
  owners[addr] = addr + size;
  return !overlaps;
}

// One thread's allocation in the threaded tests: allocates, records the block in `owners` (under
// `mu`) and in the thread's own `mine`; false when the allocation failed or overlaps another.
bool allocate_recorded(vmmckpt::device_pool& pool, std::uint64_t size, std::mutex& mu,
                       std::map<std::uint64_t, std::uint64_t>& owners, std::vector<std::uint64_t>& mine) {
  std::uint64_t addr = 0;
  if (pool.allocate(size, vmmckpt::alloc_api::cu_mem_alloc, addr) != vmmckpt::pool_status::ok) return false;
  mine.push_back(addr);
  std::lock_guard lock(mu);
  return record_disjoint(owners, addr, size);
}

constexpr std::uint64_t base = 0x200000000000ULL;
constexpr std::uint64_t MiB = 1ULL << 20;
constexpr int fake_oom = 2;

// A simulated device: mapped ranges, a physical capacity, and counters.
class fake_backend final : public physical_backend {
 public:
  explicit fake_backend(std::uint64_t capacity) : capacity_(capacity) {}

  int map_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t& handle) override {
    std::lock_guard lock(mutex_);
    if (addr % (2 * MiB) != 0 || size % (2 * MiB) != 0) throw std::logic_error("unaligned segment");
    if (used_ + size > capacity_) return fake_oom;
    auto next = mapped_.lower_bound(addr);
    if (next != mapped_.end() && next->first < addr + size) throw std::logic_error("segment overlaps");
    if (next != mapped_.begin() && std::prev(next)->first + std::prev(next)->second > addr)
      throw std::logic_error("segment overlaps");
    mapped_[addr] = size;
    used_ += size;
    handle = ++handles_;
    ++maps;
    return 0;
  }
  void unmap_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t) override {
    std::lock_guard lock(mutex_);
    if (mapped_.at(addr) != size) throw std::logic_error("unmap of a different size");
    mapped_.erase(addr);
    used_ -= size;
    ++unmaps;
  }
  void synchronize() override { ++syncs; }
  std::uint64_t submitted_work() const override { return work; }
  void submit() { ++work; }  // the program launched something
  bool is_out_of_memory(int error) const override { return error == fake_oom; }

  bool is_mapped(std::uint64_t addr, std::uint64_t size) const {
    std::lock_guard lock(mutex_);
    std::uint64_t cursor = addr;
    while (cursor < addr + size) {
      auto it = mapped_.upper_bound(cursor);
      if (it == mapped_.begin()) return false;
      --it;
      if (it->first + it->second <= cursor) return false;
      cursor = it->first + it->second;
    }
    return true;
  }
  std::uint64_t used() const {
    std::lock_guard lock(mutex_);
    return used_;
  }

  std::atomic<int> syncs{0}, maps{0}, unmaps{0};
  std::atomic<std::uint64_t> work{0};

 private:
  mutable std::mutex mutex_;
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t handles_ = 0;
  std::map<std::uint64_t, std::uint64_t> mapped_;
};

pool_policy policy(std::uint64_t growth = 64 * MiB, std::uint64_t retain = 256 * MiB,
                   std::uint64_t retain_allocations = 16) {
  pool_policy p;
  p.granularity = 2 * MiB;
  p.growth_step = growth;
  p.retain_bytes = retain;
  p.retain_allocations = retain_allocations;
  return p;
}

// Without threads' caches: every free goes to the quarantine under the pool's lock.
pool_policy uncached(pool_policy p = policy()) {
  p.cache_bytes = 0;
  return p;
}

// Never the start of a block: an interior address of the pool's first 512 bytes.
std::uint64_t addr_of_nothing() { return base + 256; }

std::uint64_t must_allocate(device_pool& pool, std::uint64_t size) {
  std::uint64_t addr = 0;
  REQUIRE(pool.allocate(size, alloc_api::cuda_malloc, addr) == pool_status::ok);
  return addr;
}

}  // namespace

TEST_CASE("physical memory grows in steps and small blocks share it", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  const auto a = must_allocate(pool, 1000);
  REQUIRE(a == base);
  REQUIRE(backend.maps == 1);
  REQUIRE(pool.stats().backed_bytes == 64 * MiB);
  for (int i = 0; i < 100; ++i) must_allocate(pool, 100000);
  REQUIRE(backend.maps == 1);  // all inside the first step
  const auto big = must_allocate(pool, 200 * MiB);
  REQUIRE(backend.is_mapped(big, 200 * MiB));
  REQUIRE(pool.stats().live_count == 102);
}

TEST_CASE("every live block is backed by mapped memory", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(6 * MiB, 8 * MiB), backend);
  std::mt19937 rng(3);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 2) {
      const std::size_t k = rng() % live.size();
      REQUIRE(pool.free(live[k].first) == pool_status::ok);
      live.erase(live.begin() + k);
    } else {
      const std::uint64_t size = (rng() % 8 == 0) ? rng() % (20 * MiB) + 1 : rng() % 50000 + 1;
      live.emplace_back(must_allocate(pool, size), size);
    }
    if (i % 100 == 0)
      for (const auto& [addr, size] : live) REQUIRE(backend.is_mapped(addr, size));
  }
  const auto s = pool.stats();
  // Physical memory held stays near live bytes: slack is the retained idle
  // handles plus, per partly used handle, less than a handle's size.
  REQUIRE(backend.used() == s.backed_bytes);
  REQUIRE(s.idle_segment_bytes <= 8 * MiB);
}

TEST_CASE("a freed block is reused only after a synchronize", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, uncached(), backend);
  const auto a = must_allocate(pool, 4096);
  must_allocate(pool, 4096);
  REQUIRE(backend.syncs == 0);
  backend.submit();  // a kernel that may still use `a`
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(backend.syncs == 0);  // free itself does not wait
  REQUIRE(pool.stats().quarantined_bytes == 4096);
  const auto b = must_allocate(pool, 4096);
  REQUIRE(backend.syncs == 1);  // the next allocation waited first...
  REQUIRE(b == a);              // ...and then placed exactly as an immediate free would
  must_allocate(pool, 4096);
  REQUIRE(backend.syncs == 1);  // nothing freed since: no wait
}

TEST_CASE("memory freed with no GPU work since the last synchronize is reused without waiting", "[pool]") {
  const bool cached = GENERATE(false, true);
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, cached ? policy() : uncached(), backend);
  // An allocate/free loop before any work: nothing can be in flight.
  for (int i = 0; i < 100; ++i) REQUIRE(pool.free(must_allocate(pool, 4096)) == pool_status::ok);
  must_allocate(pool, 4096);
  REQUIRE(backend.syncs == 0);
  // Work submitted, then a block freed: its reuse waits once...
  const auto a = must_allocate(pool, 8192);
  backend.submit();
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(must_allocate(pool, 8192) == a);
  REQUIRE(backend.syncs == 1);
  // ...and the loop after it, with no new work, does not wait again.
  for (int i = 0; i < 100; ++i) REQUIRE(pool.free(must_allocate(pool, 4096)) == pool_status::ok);
  REQUIRE(backend.syncs == 1);
  // Work submitted after the free still counts: the block it may use is waited for.
  const auto b = must_allocate(pool, 4096);
  backend.submit();
  REQUIRE(pool.free(b) == pool_status::ok);
  must_allocate(pool, 4096);
  REQUIRE(backend.syncs == 2);
}

TEST_CASE("double free, interior and foreign pointers are refused", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  const auto a = must_allocate(pool, 4096);
  REQUIRE(pool.free(a + 256) == pool_status::invalid_value);
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(pool.free(a) == pool_status::invalid_value);
  REQUIRE(pool.free(base + (1ULL << 30)) == pool_status::invalid_value);
  std::uint64_t addr = 0;
  REQUIRE(pool.allocate(0, alloc_api::cu_mem_alloc, addr) == pool_status::invalid_value);
}

TEST_CASE("wholly free handles beyond the retained amount are given back", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 64 * MiB), backend);
  std::vector<std::uint64_t> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(must_allocate(pool, 32 * MiB));
  REQUIRE(pool.stats().backed_bytes == 320 * MiB);
  backend.submit();  // kernels that may use them
  for (auto b : blocks) REQUIRE(pool.free(b) == pool_status::ok);
  const auto s = pool.stats();
  REQUIRE(s.idle_segment_bytes <= 64 * MiB);
  REQUIRE(s.backed_bytes <= 64 * MiB);
  REQUIRE(backend.unmaps > 0);
  REQUIRE(backend.syncs >= 1);  // never unmapped before waiting for the GPU
  pool.trim();
  REQUIRE(pool.stats().backed_bytes == 0);
  REQUIRE(backend.used() == 0);
}

TEST_CASE("out of physical memory: idle handles are trimmed, then a clean failure", "[pool]") {
  fake_backend backend(128 * MiB);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40), backend);  // retain everything
  const auto a = must_allocate(pool, 96 * MiB);
  REQUIRE(pool.free(a) == pool_status::ok);
  // Needs new memory elsewhere? No: placement reuses a's range after the sync.
  const auto b = must_allocate(pool, 100 * MiB);
  REQUIRE(b == a);
  // Now a block that cannot fit in 128 MiB of physical memory at all.
  std::uint64_t addr = 0;
  const auto before = pool.stats();
  REQUIRE(pool.allocate(64 * MiB, alloc_api::cuda_malloc, addr) == pool_status::out_of_memory);
  const auto after = pool.stats();
  REQUIRE(after.live_bytes == before.live_bytes);
  REQUIRE(after.live_count == before.live_count);
  // The failed request left placement untouched: the next fitting one lands where it would have.
  REQUIRE(pool.free(b) == pool_status::ok);
  REQUIRE(must_allocate(pool, 64 * MiB) == base);
}

TEST_CASE("out of physical memory with idle handles elsewhere: they are given back and the request succeeds",
          "[pool]") {
  fake_backend backend(64 * MiB);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40), backend);
  const auto small = must_allocate(pool, 40 * MiB);
  const auto filler = must_allocate(pool, 20 * MiB);
  REQUIRE(pool.free(filler) == pool_status::ok);
  REQUIRE(pool.free(small) == pool_status::ok);
  // 60 MiB mapped, all idle; a 62 MiB block at base needs more than remains, so
  // the idle handles must go back before it can be backed.
  const auto big = must_allocate(pool, 62 * MiB);
  REQUIRE(big == base);
  REQUIRE(backend.is_mapped(big, 62 * MiB));
}

TEST_CASE("pool exhaustion of the address range is out of memory, not a crash", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64 * MiB, policy(), backend);
  must_allocate(pool, 60 * MiB);
  std::uint64_t addr = 0;
  REQUIRE(pool.allocate(8 * MiB, alloc_api::cuda_malloc, addr) == pool_status::out_of_memory);
  REQUIRE(pool.allocate(1ULL << 50, alloc_api::cuda_malloc, addr) == pool_status::out_of_memory);
}

TEST_CASE("address_range names the allocation, not the handle", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  must_allocate(pool, 1000);
  const auto b = must_allocate(pool, 5000);
  std::uint64_t start = 0, size = 0;
  REQUIRE(pool.address_range(b + 4999, start, size));
  REQUIRE(start == b);
  REQUIRE(size == 5000);
  REQUIRE_FALSE(pool.address_range(base + 32 * MiB, start, size));
}

TEST_CASE("concurrent allocation and free from many threads", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(8 * MiB, 16 * MiB), backend);
  constexpr int threads = 8;
  std::atomic<bool> failed{false};
  std::vector<std::thread> workers;
  std::mutex owners_mutex;
  std::map<std::uint64_t, std::uint64_t> owners;  // addr -> end, across all threads
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::vector<std::uint64_t> mine;
      for (int i = 0; i < 3000 && !failed; ++i) {
        if (!mine.empty() && rng() % 2) {
          const std::size_t k = rng() % mine.size();
          {
            std::lock_guard lock(owners_mutex);
            owners.erase(mine[k]);
          }
          if (pool.free(mine[k]) != pool_status::ok) failed = true;
          mine.erase(mine.begin() + k);
        } else {
          if (!allocate_recorded(pool, rng() % 300000 + 1, owners_mutex, owners, mine)) {
            failed = true;
            break;
          }
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  REQUIRE_FALSE(failed);
  const auto s = pool.stats();
  REQUIRE(s.live_count == owners.size());
  for (const auto& [addr, end] : owners) REQUIRE(backend.is_mapped(addr, end - addr));
}

TEST_CASE("restored blocks are live and backed; prefilled memory waits for the replay", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 0), backend);
  REQUIRE(pool.restore_block(base + 8 * MiB, 5000, alloc_api::cuda_malloc) == pool_status::ok);
  REQUIRE(backend.is_mapped(base + 8 * MiB, 5000));
  REQUIRE(pool.restore_block(base + 8 * MiB, 100, alloc_api::cuda_malloc) == pool_status::invalid_value);
  REQUIRE(pool.free(base + 8 * MiB) == pool_status::ok);
  pool.trim();  // the block went to this thread's cache, which kept its handle mapped

  device_pool replay(base, 64ULL << 30, policy(2 * MiB, 0), backend);
  REQUIRE(replay.prefill(base, 10 * MiB) == pool_status::ok);
  const auto a = must_allocate(replay, 4 * MiB);
  REQUIRE(a == base);
  REQUIRE(replay.free(a) == pool_status::ok);
  // Retain is 0, yet the prefilled handles stay: the replay is not over.
  REQUIRE(backend.is_mapped(base + 4 * MiB, 6 * MiB));
}

TEST_CASE("suspend gives every handle back; resume rebuilds memory under every live block", "[pool]") {
  fake_backend backend(64 * MiB);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40), backend);
  const auto a = must_allocate(pool, 10 * MiB);
  const auto b = must_allocate(pool, 3000);
  const auto c = must_allocate(pool, 20 * MiB);
  REQUIRE(pool.free(b) == pool_status::ok);
  const int syncs = backend.syncs;
  REQUIRE(pool.release_all_physical() > 0);
  REQUIRE(backend.syncs == syncs + 1);  // the GPU was idle before anything was unmapped
  REQUIRE(backend.used() == 0);
  REQUIRE(pool.stats().live_count == 2);  // the blocks survive the suspend
  REQUIRE(pool.rebuild_physical() == pool_status::ok);
  REQUIRE(backend.is_mapped(a, 10 * MiB));
  REQUIRE(backend.is_mapped(c, 20 * MiB));
  REQUIRE(backend.is_mapped(b, 3000));  // b waits in this thread's cache: its memory came back too
  REQUIRE(pool.check_invariants().empty());
  REQUIRE(pool.free(a) == pool_status::ok);  // and behave as before
  const int resumed_syncs = backend.syncs;
  REQUIRE(must_allocate(pool, 3000) == b);  // from the cache: the suspend's synchronize covered it
  REQUIRE(backend.syncs == resumed_syncs);
  REQUIRE(pool.free(b) == pool_status::ok);
  pool.trim();                                            // a's and b's ranges are free again
  REQUIRE(must_allocate(pool, 1000) == base + 64 * MiB);  // b's small-block chunk
  REQUIRE(must_allocate(pool, 10 * MiB) == base);         // a's range

  // Resume without enough memory fails cleanly, leaves nothing mapped, and can be tried again.
  fake_backend small(4 * MiB);
  device_pool suspended(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40), small);
  const auto kept = must_allocate(suspended, 3 * MiB);
  REQUIRE(suspended.release_all_physical() == 4 * MiB);
  device_pool other(base + (64ULL << 30), 64ULL << 30, policy(2 * MiB, 0), small);
  const auto squatter = must_allocate(other, 2 * MiB);  // another program takes the memory meanwhile
  REQUIRE(suspended.rebuild_physical() == pool_status::out_of_memory);
  REQUIRE(small.used() == 2 * MiB);
  REQUIRE(other.free(squatter) == pool_status::ok);
  other.trim();
  REQUIRE(suspended.rebuild_physical() == pool_status::ok);
  REQUIRE(small.is_mapped(kept, 3 * MiB));
}

TEST_CASE("resume short of memory backs each block alone rather than fail on growth steps", "[pool]") {
  fake_backend backend(256 * MiB);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  const auto small_block = must_allocate(pool, 1000);  // its chunk grows by a whole 64 MiB step
  const auto large_block = must_allocate(pool, 4 * MiB);
  REQUIRE(backend.used() == 68 * MiB);
  REQUIRE(pool.release_all_physical() == 68 * MiB);
  device_pool other(base + (64ULL << 30), 64ULL << 30, policy(2 * MiB, 0), backend);
  must_allocate(other, 190 * MiB);  // meanwhile another program leaves 66 MiB: a step and 2 MiB
  REQUIRE(pool.rebuild_physical() == pool_status::ok);
  REQUIRE(backend.is_mapped(small_block, 1000));
  REQUIRE(backend.is_mapped(large_block, 4 * MiB));
  REQUIRE(backend.used() == 190 * MiB + 2 * MiB + 4 * MiB);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("the pool's own consistency check passes through growth, trimming, suspend and resume", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 4 * MiB), backend);
  std::mt19937 rng(11);
  std::vector<std::uint64_t> live;
  for (int i = 0; i < 500; ++i) {
    if (!live.empty() && rng() % 2) {
      const std::size_t k = rng() % live.size();
      REQUIRE(pool.free(live[k]) == pool_status::ok);
      live.erase(live.begin() + k);
    } else {
      live.push_back(must_allocate(pool, rng() % (5 * MiB) + 1));
    }
    if (i % 50 == 0) REQUIRE(pool.check_invariants().empty());
  }
  pool.release_all_physical();
  REQUIRE(pool.check_invariants().empty());
  REQUIRE(pool.rebuild_physical() == pool_status::ok);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("small blocks grow within their chunk; a larger block gets a handle of its own size", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(256 * MiB), backend);
  REQUIRE(must_allocate(pool, 1000) == base);
  REQUIRE(pool.stats().backed_bytes == 64 * MiB);  // a 256 MiB step, cut at the small-block chunk's end
  const auto big = must_allocate(pool, 3 * MiB);
  REQUIRE(big == base + 64 * MiB);                 // outside the chunk
  REQUIRE(pool.stats().backed_bytes == 68 * MiB);  // 3 MiB in whole 2 MiB granules, nothing more
  REQUIRE(pool.stats().segment_count == 2);
  for (int i = 0; i < 200; ++i) must_allocate(pool, 100000);  // 19 MiB more small blocks: no new handle
  REQUIRE(backend.maps == 2);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("an idle handle reaching past a new block is given back, not kept under it", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40), backend);
  const auto a = must_allocate(pool, 60 * MiB);
  must_allocate(pool, 2 * MiB);
  backend.submit();
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(backend.used() == 62 * MiB);  // a's handle is idle, kept
  const auto b = must_allocate(pool, 10 * MiB);
  REQUIRE(b == a);
  REQUIRE(backend.syncs == 1);          // a's handle went back only after the GPU was done with it
  REQUIRE(backend.used() == 12 * MiB);  // b did not keep a's 60 MiB held
  REQUIRE(backend.is_mapped(b, 10 * MiB));
  REQUIRE(pool.check_invariants().empty());
  // A block that fits its idle handle uses it again: an alloc/free loop maps once.
  const int maps = backend.maps;
  for (int i = 0; i < 100; ++i) REQUIRE(pool.free(must_allocate(pool, 32 * MiB)) == pool_status::ok);
  REQUIRE(backend.maps == maps + 1);
}

TEST_CASE("idle handles that allocations keep passing over are given back", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40, 3), backend);
  const auto a = must_allocate(pool, 32 * MiB);
  must_allocate(pool, 1000);
  REQUIRE(pool.free(a) == pool_status::ok);
  must_allocate(pool, 1000);
  must_allocate(pool, 1000);
  REQUIRE(backend.is_mapped(a, 32 * MiB));  // two allocations passed it over: still kept
  must_allocate(pool, 1000);
  REQUIRE_FALSE(backend.is_mapped(a, 32 * MiB));  // the third: given back
  REQUIRE(pool.stats().idle_segment_bytes == 0);
  REQUIRE(backend.used() == 2 * MiB);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("memory mapped for a new block gives back as much idle memory", "[pool]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40), backend);
  const auto a = must_allocate(pool, 32 * MiB);
  const auto b = must_allocate(pool, 32 * MiB);
  REQUIRE(pool.free(a) == pool_status::ok);
  const auto c = must_allocate(pool, 40 * MiB);  // a's 32 MiB are too few: new memory
  REQUIRE(c == base + 64 * MiB);
  REQUIRE_FALSE(backend.is_mapped(a, 2 * MiB));  // a's idle handle went back
  REQUIRE(backend.is_mapped(b, 32 * MiB));
  REQUIRE(backend.used() == 72 * MiB);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("physical memory under the fragmenting pattern stays within 1.1 x live + one growth step", "[pool]") {
  // bench/frag.cu's pattern (the figure docs/pool.md gives): 8 GiB live, 20000 steps of churn.
  for (const std::uint64_t step : {64 * MiB, 2 * MiB}) {
    fake_backend backend(1ULL << 40);
    pool_policy p;
    p.growth_step = step;
    device_pool pool(base, 512ULL << 30, p, backend);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
    int samples = 0;
    const std::uint64_t live_bytes = bench::run_frag_pattern<std::uint64_t>(
        8ULL << 30, 20000, 42, [&](std::uint64_t size) { return must_allocate(pool, size); },
        [&](std::uint64_t addr) { REQUIRE(pool.free(addr) == pool_status::ok); },
        [&](std::uint64_t live_now) {
          ++samples;
          REQUIRE(backend.used() <= live_now + live_now / 10 + 64 * MiB);
          REQUIRE(pool.check_invariants().empty());
        },
        live);
    REQUIRE(samples == 41);
    REQUIRE(backend.used() <= live_bytes + live_bytes / 10 + 64 * MiB);
    REQUIRE(backend.used() >= live_bytes);
  }
}

// ---- threads' caches of freed small blocks ----

TEST_CASE("a cached block is not live: a second free, its interior and its range are refused", "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  const auto a = must_allocate(pool, 4096);
  const auto b = must_allocate(pool, 5000);
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(pool.stats().cached_count == 1);              // it is in this thread's cache...
  REQUIRE(pool.free(a) == pool_status::invalid_value);  // ...and no longer an allocation
  REQUIRE(pool.free(a + 512) == pool_status::invalid_value);
  std::uint64_t start = 0, size = 0;
  REQUIRE_FALSE(pool.address_range(a, start, size));
  REQUIRE_FALSE(pool.address_range(a + 100, start, size));
  REQUIRE(pool.address_range(b + 100, start, size));
  REQUIRE(start == b);
  REQUIRE(size == 5000);
  // Taken again, it is an allocation again, with what the new caller asked for.
  REQUIRE(must_allocate(pool, 4000) == a);  // 4000 and 4096 round to the same 4096
  REQUIRE(pool.address_range(a + 3999, start, size));
  REQUIRE(size == 4000);
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(pool.free(a) == pool_status::invalid_value);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("cached blocks are left out of live_blocks and of the live bytes", "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  const auto a = must_allocate(pool, 1000);
  const auto b = must_allocate(pool, 70000);
  const auto c = must_allocate(pool, 3 * MiB);  // too large for a cache
  REQUIRE(pool.free(a) == pool_status::ok);
  const auto live = pool.live_blocks();
  REQUIRE(live.size() == 2);
  REQUIRE(live[0].addr == b);
  REQUIRE(live[0].requested == 70000);
  REQUIRE(live[0].tag == static_cast<std::uint32_t>(alloc_api::cuda_malloc));
  REQUIRE(live[1].addr == c);
  const auto s = pool.stats();
  REQUIRE(s.live_count == 2);
  REQUIRE(s.live_bytes == 70144 + 3 * MiB);
  REQUIRE(s.cached_count == 1);
  REQUIRE(s.cached_bytes == 1024);
  REQUIRE(s.quarantined_bytes == 0);
  REQUIRE(pool.free(c) == pool_status::ok);  // a large block still goes to the quarantine
  REQUIRE(pool.stats().quarantined_bytes == 3 * MiB);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("the live list: in address order either way it is taken, and every change counted", "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  std::vector<std::uint64_t> blocks;
  for (int i = 0; i < 5000; ++i) blocks.push_back(must_allocate(pool, 100 + (i % 7) * 300));
  const auto locked = pool.live_allocations();
  REQUIRE(locked.size() == blocks.size());
  for (std::size_t i = 1; i < locked.size(); ++i) REQUIRE(locked[i - 1].addr < locked[i].addr);
  REQUIRE(pool.live_allocations_unlocked() == locked);
  // Unchanged, the count stays; every allocation, free, and block taken back from a thread's cache
  // moves it.
  const std::uint64_t before = pool.changes();
  REQUIRE(pool.changes() == before);
  REQUIRE(pool.free(blocks[10]) == pool_status::ok);  // into this thread's cache
  const std::uint64_t after_free = pool.changes();
  REQUIRE(after_free > before);
  const auto again = must_allocate(pool, 100 + (10 % 7) * 300);  // the cached block, taken back
  REQUIRE(again == blocks[10]);
  REQUIRE(pool.changes() > after_free);
  REQUIRE(pool.live_allocations() == locked);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("a cached block is reused only after a synchronize when work was submitted before its free",
          "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(), backend);
  const auto a = must_allocate(pool, 4096);
  backend.submit();  // a kernel that may still use `a`
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(backend.syncs == 0);
  REQUIRE(must_allocate(pool, 4096) == a);
  REQUIRE(backend.syncs == 1);               // waited before handing it out again
  REQUIRE(pool.free(a) == pool_status::ok);  // no work since that synchronize began
  REQUIRE(must_allocate(pool, 4096) == a);
  REQUIRE(backend.syncs == 1);

  // Work after the free does not matter, work before it does, however many frees come between.
  REQUIRE(pool.free(a) == pool_status::ok);
  backend.submit();
  REQUIRE(must_allocate(pool, 4096) == a);
  REQUIRE(backend.syncs == 1);
  const auto b = must_allocate(pool, 8192);
  backend.submit();
  REQUIRE(pool.free(b) == pool_status::ok);
  REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(must_allocate(pool, 4096) == a);
  REQUIRE(backend.syncs == 2);
  REQUIRE(must_allocate(pool, 8192) == b);  // the same synchronize covered b
  REQUIRE(backend.syncs == 2);

  // A synchronize another thread waited for covers this thread's cached blocks freed before it began.
  REQUIRE(pool.free(a) == pool_status::ok);
  backend.submit();
  std::thread([&] {
    const auto x = must_allocate(pool, 100000);
    REQUIRE(pool.free(x) == pool_status::ok);
    REQUIRE(must_allocate(pool, 100000) == x);  // work before x's free: it waits
  }).join();
  REQUIRE(backend.syncs == 3);
  REQUIRE(must_allocate(pool, 4096) == a);
  REQUIRE(backend.syncs == 3);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("a thread's cache stays within its bounds; what it gives back follows the quarantine's rule",
          "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  pool_policy p = policy();
  p.cache_blocks = 4;
  p.cache_bytes = 64 * 1024;
  device_pool pool(base, 64ULL << 30, p, backend);
  std::vector<std::uint64_t> blocks;
  for (int i = 0; i < 20; ++i) blocks.push_back(must_allocate(pool, 512 * (i + 1)));
  backend.submit();
  for (auto b : blocks) {
    REQUIRE(pool.free(b) == pool_status::ok);
    const auto s = pool.stats();
    REQUIRE(s.cached_count <= 4);
    REQUIRE(s.cached_bytes <= 64 * 1024);
    REQUIRE(pool.check_invariants().empty());
  }
  REQUIRE(backend.syncs == 0);
  REQUIRE(pool.stats().quarantined_bytes > 0);  // work was submitted before: quarantined, not freed
  // A block as large as the whole cache is never cached.
  const auto big = must_allocate(pool, 64 * 1024 + 1);
  REQUIRE(backend.syncs == 1);  // the quarantine's synchronize
  const auto cached_before = pool.stats().cached_count;
  REQUIRE(pool.free(big) == pool_status::ok);
  REQUIRE(pool.stats().cached_count == cached_before);
}

TEST_CASE("out of memory: blocks in threads' caches go back before an allocation fails", "[pool][cache]") {
  fake_backend backend(62 * MiB);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 1ULL << 40), backend);
  const auto a = must_allocate(pool, 1 * MiB);
  REQUIRE(a == base);
  backend.submit();
  std::thread([&] { REQUIRE(pool.free(a) == pool_status::ok); }).join();  // that thread's cache...
  // ...went back when the thread ended.
  REQUIRE(pool.stats().cached_count == 0);
  const auto b = must_allocate(pool, 1 * MiB);
  REQUIRE(b == base);
  REQUIRE(pool.free(b) == pool_status::ok);  // in this thread's cache, its handle counted as in use
  REQUIRE(pool.stats().cached_count == 1);
  // 62 MiB can only be had at base, with b's handle given back and its memory reused.
  const auto c = must_allocate(pool, 62 * MiB);
  REQUIRE(c == base);
  REQUIRE(pool.stats().cached_count == 0);
  REQUIRE(backend.used() == 62 * MiB);
  REQUIRE(pool.check_invariants().empty());
}

TEST_CASE("suspend and resume with blocks in threads' caches", "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 0), backend);
  const auto live = must_allocate(pool, 5 * MiB);
  const auto cached = must_allocate(pool, 700000);
  backend.submit();
  REQUIRE(pool.free(cached) == pool_status::ok);
  REQUIRE(pool.release_all_physical() > 0);
  REQUIRE(backend.used() == 0);
  REQUIRE(pool.check_invariants().empty());
  REQUIRE(pool.live_blocks().size() == 1);  // what a resume compares with the image
  REQUIRE(pool.stats().cached_count == 1);  // the cache survives, so placement goes on as without the suspend
  REQUIRE(pool.rebuild_physical() == pool_status::ok);
  REQUIRE(backend.is_mapped(live, 5 * MiB));
  REQUIRE(backend.is_mapped(cached, 700000));
  REQUIRE(pool.check_invariants().empty());
  const int syncs = backend.syncs;
  REQUIRE(must_allocate(pool, 700000) == cached);
  REQUIRE(backend.syncs == syncs);  // the suspend's synchronize covered it

  // A thread that ends while the program is suspended gives its cache back with no memory under it.
  std::uint64_t other = 0;
  std::thread([&] {
    other = must_allocate(pool, 3000);
    REQUIRE(pool.free(other) == pool_status::ok);
    pool.release_all_physical();
  }).join();
  REQUIRE(pool.check_invariants().empty());
  REQUIRE(pool.rebuild_physical() == pool_status::ok);
  REQUIRE(pool.check_invariants().empty());
  REQUIRE(pool.stats().cached_count == 0);
  REQUIRE(pool.live_blocks().size() == 2);
  REQUIRE(backend.is_mapped(live, 5 * MiB));
  REQUIRE(backend.is_mapped(cached, 700000));
}

TEST_CASE("trim empties other threads' caches; a pool gone leaves no stale cache behind", "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  {
    device_pool pool(base, 64ULL << 30, policy(2 * MiB, 0), backend);
    std::mutex m;
    std::condition_variable cv;
    int step = 0;
    std::uint64_t a = 0;
    std::thread t([&] {
      a = must_allocate(pool, 8192);
      REQUIRE(pool.free(a) == pool_status::ok);
      std::unique_lock lock(m);
      step = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return step == 2; });
      REQUIRE(must_allocate(pool, 8192) == a);  // placed anew: its range was free again
    });
    {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return step == 1; });
    }
    REQUIRE(pool.stats().cached_count == 1);
    pool.trim();
    REQUIRE(pool.stats().cached_count == 0);
    REQUIRE(backend.used() == 0);
    REQUIRE(pool.check_invariants().empty());
    {
      std::lock_guard lock(m);
      step = 2;
    }
    cv.notify_all();
    t.join();
    REQUIRE(pool.check_invariants().empty());
    must_allocate(pool, 20000);
    REQUIRE(pool.free(must_allocate(pool, 20000)) == pool_status::ok);  // this thread's cache now holds a block
  }
  // A new pool, likely at the same address as the one just gone: nothing of the old cache reaches it.
  fake_backend fresh(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(2 * MiB, 0), fresh);
  REQUIRE(pool.stats().cached_count == 0);
  REQUIRE(must_allocate(pool, 20000) == base);
  REQUIRE(fresh.maps == 1);
  REQUIRE(pool.check_invariants().empty());
}

namespace {

// One fixed interleaving of three threads' calls (each call runs on its thread, in the script's order),
// with or without GPU work before every free. Returns every address handed out, in order.
std::vector<std::uint64_t> scripted_run(bool work_before_frees) {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(8 * MiB, 16 * MiB), backend);
  constexpr int threads = 3;
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;
  std::vector<std::uint64_t> out;
  std::vector<std::uint64_t> shared_live;
  std::mt19937 script(7);
  std::vector<int> order;
  for (int i = 0; i < 3000; ++i) order.push_back(static_cast<int>(script() % threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(50 + t);
      for (std::size_t step = 0; step < order.size(); ++step) {
        if (order[step] != t) continue;
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return turn == static_cast<int>(step); });
        // Frees of any thread's blocks, so blocks move between threads' caches.
        if (!shared_live.empty() && rng() % 2) {
          const std::size_t k = rng() % shared_live.size();
          if (work_before_frees) backend.submit();
          REQUIRE(pool.free(shared_live[k]) == pool_status::ok);
          shared_live.erase(shared_live.begin() + static_cast<long>(k));
        } else {
          const std::uint64_t size = rng() % 4 == 0 ? rng() % (3 * MiB) + 1 : (rng() % 16 + 1) * 1000;
          const auto a = must_allocate(pool, size);
          out.push_back(a);
          shared_live.push_back(a);
        }
        ++turn;
        cv.notify_all();
      }
    });
  }
  for (auto& w : workers) w.join();
  REQUIRE(pool.check_invariants().empty());
  if (work_before_frees) REQUIRE(backend.syncs > 0);
  return out;
}

}  // namespace

TEST_CASE("placement is a function of the calls and their order, not of when the GPU is waited for", "[pool][cache]") {
  const auto first = scripted_run(false);
  REQUIRE(scripted_run(false) == first);
  REQUIRE(scripted_run(true) == first);
}

TEST_CASE("many threads allocating and freeing each other's blocks, checked while they run", "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(8 * MiB, 16 * MiB), backend);
  constexpr int threads = 8;
  std::atomic<bool> failed{false}, done{false};
  std::mutex owners_mutex;
  std::map<std::uint64_t, std::uint64_t> owners;  // addr -> end, across all threads
  std::vector<std::uint64_t> handoff;             // blocks one thread leaves for another to free
  std::string problem;
  std::atomic<int> checks{0};
  std::thread checker([&] {
    for (int i = 0; !done; ++i, ++checks) {
      if (std::string why = pool.check_invariants(); !why.empty()) {
        std::lock_guard lock(owners_mutex);
        problem = why;
        failed = true;
      }
      pool.live_blocks();
      pool.stats();
      if (i % 8 == 7) pool.trim();  // empties every thread's cache under their feet
      if (i % 4 == 0) backend.submit();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(200 + t);
      std::vector<std::uint64_t> mine;
      auto release = [&](std::uint64_t a) {
        {
          std::lock_guard lock(owners_mutex);
          owners.erase(a);
        }
        if (pool.free(a) != pool_status::ok) failed = true;
      };
      for (int i = 0; i < 4000 && !failed; ++i) {
        const unsigned r = rng() % 9;  // frees 3, hand-offs 1, frees of hand-offs 1, allocations 4
        if (!mine.empty() && r < 3) {
          const std::size_t k = rng() % mine.size();
          release(mine[k]);
          mine.erase(mine.begin() + static_cast<long>(k));
        } else if (!mine.empty() && r == 3) {
          std::lock_guard lock(owners_mutex);
          handoff.push_back(mine.back());
          mine.pop_back();
        } else if (r == 4) {
          std::uint64_t a = 0;
          {
            std::lock_guard lock(owners_mutex);
            if (handoff.empty()) continue;
            a = handoff.back();
            handoff.pop_back();
          }
          release(a);
        } else {
          const std::uint64_t size = rng() % 16 == 0 ? rng() % (4 * MiB) + 1 : rng() % 20000 + 1;
          if (!allocate_recorded(pool, size, owners_mutex, owners, mine)) {
            failed = true;
            break;
          }
        }
        if (pool.free(addr_of_nothing()) != pool_status::invalid_value) failed = true;
      }
      std::lock_guard lock(owners_mutex);
      for (auto a : mine) handoff.push_back(a);  // left for the end
    });
  }
  for (auto& w : workers) w.join();
  done = true;
  checker.join();
  INFO(problem);
  REQUIRE_FALSE(failed);
  REQUIRE(checks > 0);
  REQUIRE(pool.check_invariants().empty());
  REQUIRE(pool.stats().cached_count == 0);  // every worker ended: their caches went back
  const auto live = pool.live_blocks();
  REQUIRE(live.size() == owners.size());
  for (const auto& b : live) {
    REQUIRE(owners.count(b.addr) == 1);
    REQUIRE(owners[b.addr] == b.addr + b.requested);
    REQUIRE(backend.is_mapped(b.addr, b.requested));
  }
  for (auto a : handoff) REQUIRE(pool.free(a) == pool_status::ok);
  REQUIRE(pool.stats().live_count == 0);
  REQUIRE(pool.check_invariants().empty());
  pool.trim();
  REQUIRE(backend.used() == 0);
}

TEST_CASE("fork while other threads allocate: the child finds every lock of the pool free", "[pool][cache]") {
  fake_backend backend(1ULL << 40);
  device_pool pool(base, 64ULL << 30, policy(8 * MiB, 16 * MiB), backend);
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(300 + t);
      std::vector<std::uint64_t> mine;
      while (!stop) {
        if (mine.size() > 20 || (!mine.empty() && rng() % 2)) {
          pool.free(mine.back());
          mine.pop_back();
        } else {
          std::uint64_t a = 0;
          if (pool.allocate(rng() % 30000 + 1, alloc_api::cuda_malloc, a) == pool_status::ok) mine.push_back(a);
        }
      }
      for (auto a : mine) pool.free(a);
    });
  }
  for (int round = 0; round < 20; ++round) {
    pool.hold_for_fork();
    const pid_t child = fork();
    if (child == 0) {
      pool.release_after_fork();
      // Single-threaded now, with the other threads' caches as they were at the fork.
      int code = pool.check_invariants().empty() ? 0 : 1;
      std::uint64_t a = 0;
      if (pool.allocate(4096, alloc_api::cuda_malloc, a) != pool_status::ok || pool.free(a) != pool_status::ok)
        code = 2;
      pool.live_blocks();
      pool.stats();
      pool.trim();
      if (!pool.check_invariants().empty()) code = 3;
      _exit(code);
    }
    pool.release_after_fork();
    REQUIRE(child > 0);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  stop = true;
  for (auto& w : workers) w.join();
  REQUIRE(pool.check_invariants().empty());
  REQUIRE(pool.stats().live_count == 0);
}
