// Unit tests of deterministic placement: alignment, coalescing, fragmentation, exhaustion, reuse rules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/pool/range_allocator.hpp"

using vmmckpt::range_allocator;

namespace {

constexpr std::uint64_t base = 0x200000000000ULL;
constexpr std::uint64_t MiB = 1ULL << 20;

// Replays a seeded random sequence of allocations and frees; returns every address handed out.
std::vector<std::uint64_t> replay(std::uint32_t seed, std::uint64_t pool_size, int steps) {
  range_allocator a(base, pool_size);
  std::mt19937 rng(seed);
  std::vector<std::uint64_t> live, out;
  for (int i = 0; i < steps; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      const std::size_t k = rng() % live.size();
      REQUIRE(a.retire(live[k]));
      live.erase(live.begin() + k);
      if (rng() % 2) a.reclaim_retired();
    } else {
      const std::uint64_t size = (rng() % 4 == 0) ? (rng() % (64 * MiB)) + 1 : (rng() % 100000) + 1;
      if (auto p = a.allocate(size)) {
        live.push_back(*p);
        out.push_back(*p);
      } else {
        out.push_back(0);
      }
    }
  }
  REQUIRE(std::string(a.check_invariants()).empty());
  return out;
}

}  // namespace

TEST_CASE("the same call sequence gives the same addresses", "[allocator]") {
  const auto first = replay(7, 8ULL << 30, 4000);
  const auto second = replay(7, 8ULL << 30, 4000);
  REQUIRE(first == second);
  // And a different sequence really differs (the check above is not vacuous).
  REQUIRE(replay(8, 8ULL << 30, 4000) != first);
}

TEST_CASE("blocks are aligned: 512 bytes, 2 MiB from 2 MiB up", "[allocator]") {
  range_allocator a(base, 1ULL << 30);
  for (std::uint64_t size : std::vector<std::uint64_t>{1, 255, 256, 513, 4097, 2 * MiB - 1, 2 * MiB, 3 * MiB + 5, 1}) {
    auto p = a.allocate(size);
    REQUIRE(p);
    REQUIRE(*p % 512 == 0);
    if (range_allocator::rounded_size(size) >= 2 * MiB) REQUIRE(*p % (2 * MiB) == 0);
  }
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("first block lands at the pool base, the next right after it", "[allocator]") {
  range_allocator a(base, 1ULL << 30);
  REQUIRE(a.allocate(1000) == base);
  REQUIRE(a.allocate(1000) == base + 1024);
  // Large: outside the small-block chunk the first two opened, on the next 2 MiB boundary after it.
  REQUIRE(a.allocate(4 * MiB) == base + 64 * MiB);
  REQUIRE(a.allocate(100) == base + 2048);  // small: right after the other small ones
  // A large block first opens the pool too.
  range_allocator b(base, 1ULL << 30);
  REQUIRE(b.allocate(3 * MiB) == base);
  REQUIRE(b.allocate(4 * MiB) == base + 4 * MiB);
}

TEST_CASE("freed neighbours coalesce into one range", "[allocator]") {
  range_allocator a(base, 64 * MiB);
  auto x = a.allocate(1 * MiB), y = a.allocate(1 * MiB), z = a.allocate(1 * MiB);
  REQUIRE((x && y && z));
  REQUIRE(a.free_range_count() == 1);
  REQUIRE(a.release(*y));
  REQUIRE(a.free_range_count() == 2);
  REQUIRE(a.release(*x));
  REQUIRE(a.free_range_count() == 2);  // x+y merged, tail separate
  REQUIRE(a.release(*z));
  REQUIRE(a.free_range_count() == 1);
  REQUIRE(a.largest_free() == 64 * MiB);
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("best fit picks the smallest hole that fits", "[allocator]") {
  range_allocator a(base, 64 * MiB);
  std::vector<std::uint64_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(*a.allocate(64 * 1024));
  auto small_hole_neighbour = a.allocate(512);  // keeps the holes apart
  (void)small_hole_neighbour;
  a.release(blocks[1]);  // 64 KiB hole
  a.release(blocks[4]);
  a.release(blocks[5]);  // 128 KiB hole
  REQUIRE(a.allocate(60 * 1024) == blocks[1]);
  REQUIRE(a.allocate(100 * 1024) == blocks[4]);
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("exhaustion fails cleanly and recovers after a free", "[allocator]") {
  range_allocator a(base, 8 * MiB);
  std::vector<std::uint64_t> blocks;
  while (auto p = a.allocate(1 * MiB)) blocks.push_back(*p);
  REQUIRE(blocks.size() == 8);
  REQUIRE_FALSE(a.allocate(1));
  REQUIRE_FALSE(a.allocate(1ULL << 40));
  REQUIRE(a.release(blocks[3]));
  REQUIRE(a.allocate(1 * MiB) == blocks[3]);
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("fragmentation: a large block needs a large aligned hole", "[allocator]") {
  range_allocator a(base, 16 * MiB);
  std::vector<std::uint64_t> smalls;
  for (int i = 0; i < 16; ++i) smalls.push_back(*a.allocate(1 * MiB - 512));  // fill with near-1MiB blocks
  for (std::size_t i = 0; i < smalls.size(); i += 2) a.release(smalls[i]);    // half the space, in 1 MiB holes
  REQUIRE_FALSE(a.allocate(2 * MiB));                                         // no 2 MiB hole anywhere
  REQUIRE(a.allocate(512 * 1024));                                            // small ones still fit
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("retire keeps a range out of reuse until reclaimed", "[allocator]") {
  range_allocator a(base, 64 * MiB);
  auto x = *a.allocate(4096);
  REQUIRE(a.retire(x));
  REQUIRE_FALSE(a.retire(x));                // double free
  REQUIRE_FALSE(a.retire(x + 512));          // interior pointer
  REQUIRE_FALSE(a.retire(base + 32 * MiB));  // never allocated
  REQUIRE(a.find(x) == nullptr);
  auto y = *a.allocate(4096);
  REQUIRE(y != x);  // quarantined range not handed out
  a.reclaim_retired();
  REQUIRE(a.allocate(4096) == x);  // same as if it had been freed at once
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("find returns the block containing an interior address", "[allocator]") {
  range_allocator a(base, 64 * MiB);
  auto x = *a.allocate(10000, 42);
  const auto* b = a.find(x + 9999);
  REQUIRE(b != nullptr);
  REQUIRE(b->addr == x);
  REQUIRE(b->requested == 10000);
  REQUIRE(b->tag == 42);
  REQUIRE(a.find(x + 10240) == nullptr);  // past the rounded end
  REQUIRE(a.find(base - 1) == nullptr);
}

TEST_CASE("a replayed allocation log lands exactly where it did", "[allocator]") {
  // A log as a program would produce: sizes and frees by index.
  struct step {
    bool alloc;
    std::uint64_t size_or_index;
  };
  const std::vector<step> log = {{true, 4 << 20}, {true, 512},     {true, 100 << 20}, {false, 1},
                                 {true, 256},     {true, 3 << 20}, {false, 0},        {true, 1 << 20}};
  auto run = [&] {
    range_allocator a(base, 1ULL << 30);
    std::vector<std::uint64_t> addrs;
    for (const auto& s : log) {
      if (s.alloc)
        addrs.push_back(*a.allocate(s.size_or_index));
      else {
        a.retire(addrs[s.size_or_index]);
        a.reclaim_retired();
      }
    }
    return addrs;
  };
  const auto addrs = run();
  REQUIRE(addrs == run());
  REQUIRE(addrs[0] == base);
  REQUIRE(addrs[1] == base + 64 * MiB);   // the first small block opens a chunk past the large one
  REQUIRE(addrs[2] == base + 128 * MiB);  // 100 MiB: the 60 MiB below the chunk is too small
  REQUIRE(addrs[3] == addrs[1]);          // 256 B reuses the freed 512 B block's chunk
}

TEST_CASE("claim places a block exactly where an image says, and placement goes on around it", "[allocator]") {
  range_allocator a(base, 64 * MiB);
  REQUIRE(a.claim(base + 4 * MiB, 1000, 7));
  REQUIRE_FALSE(a.claim(base + 4 * MiB + 512, 10));  // overlaps the claimed block
  REQUIRE_FALSE(a.claim(base + 100, 10));            // misaligned
  REQUIRE_FALSE(a.claim(base + 64 * MiB, 10));       // outside the pool
  REQUIRE(a.find(base + 4 * MiB + 999)->tag == 7);
  REQUIRE(a.allocate(1000) == base);  // new blocks never overlap it
  REQUIRE(a.allocate(4 * MiB) == base + 6 * MiB);
  REQUIRE(a.release(base + 4 * MiB));  // freeing a claimed block works
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("small blocks share chunks, larger blocks stay outside them", "[allocator]") {
  range_allocator a(base, 4ULL << 30);
  // Small blocks fill the first chunk before a second one opens.
  std::vector<std::uint64_t> smalls;
  for (int i = 0; i < 64; ++i) smalls.push_back(*a.allocate(1 * MiB - 512));
  REQUIRE(a.small_chunk_count() == 1);
  for (auto p : smalls) REQUIRE(p < base + 64 * MiB);
  const auto large = *a.allocate(2 * MiB);
  REQUIRE(large == base + 64 * MiB);  // outside the chunk, whatever room is left in it
  const auto next_small = *a.allocate(1 * MiB);
  REQUIRE(next_small == base + 128 * MiB);  // no room left in the first chunk: a second one opens
  REQUIRE(a.small_chunk_count() == 2);
  REQUIRE(a.allocate(30 * 1024) == base + 64 * (MiB - 512));  // the 32 KiB left in the first chunk
  REQUIRE(a.in_small_chunk(base + 100));
  REQUIRE_FALSE(a.in_small_chunk(large));
  REQUIRE(a.chunk_begin(base + 70 * MiB) == base + 64 * MiB);
  REQUIRE(a.chunk_end(base + 70 * MiB) == base + 128 * MiB);
  REQUIRE(std::string(a.check_invariants()).empty());
  // With its last small block gone a chunk is ordinary space again: a large block may use it.
  REQUIRE(a.release(next_small));
  REQUIRE(a.small_chunk_count() == 1);
  REQUIRE(a.allocate(64 * MiB) == base + 66 * MiB);  // reaching into what was the second chunk
  for (auto p : smalls) REQUIRE(a.release(p));
  REQUIRE(a.small_chunk_count() == 1);                // the 30 KiB block still holds the first chunk...
  REQUIRE(a.allocate(62 * MiB) == base + 130 * MiB);  // ...so its free 63.9 MiB are not for large blocks
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("when no chunk is wholly free, small and large blocks fall back to each other's space", "[allocator]") {
  range_allocator a(base, 96 * MiB);  // one whole chunk and half of another
  REQUIRE(a.allocate(40 * MiB) == base);
  // No whole chunk is free: best fit over the rest, and the chunk it lands in holds small blocks now.
  const auto small = *a.allocate(4096);
  REQUIRE(small == base + 40 * MiB);
  REQUIRE(a.small_chunk_count() == 1);
  REQUIRE(a.allocate(30 * MiB) == base + 64 * MiB);  // large: outside that chunk while room is left there
  REQUIRE(a.allocate(4096) == base + 40 * MiB + 4096);
  // Only the chunk's free space is left; a large block goes there rather than fail.
  REQUIRE(a.allocate(16 * MiB) == base + 42 * MiB);
  REQUIRE(std::string(a.check_invariants()).empty());
}

TEST_CASE("placement depends only on the live blocks: claiming them again gives the same placement", "[allocator]") {
  // A process restored from an image claims the image's blocks; its next allocations must land where
  // the original's would have.
  std::mt19937 rng(5);
  auto random_size = [&] {
    const auto r = rng() % 10;
    return r < 5   ? rng() % 100000 + 1
           : r < 8 ? rng() % (2 * MiB) + 1
           : r < 9 ? rng() % (4 * MiB) + 1
                   : rng() % (40 * MiB) + 1;
  };
  range_allocator original(base, 16ULL << 30);
  std::vector<std::uint64_t> live;
  for (int i = 0; i < 3000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      const std::size_t k = rng() % live.size();
      REQUIRE(original.release(live[k]));
      live.erase(live.begin() + k);
    } else if (auto p = original.allocate(random_size())) {
      live.push_back(*p);
    }
  }
  REQUIRE(original.small_chunk_count() > 1);
  auto blocks = original.live_blocks();
  std::shuffle(blocks.begin(), blocks.end(), rng);
  range_allocator restored(base, 16ULL << 30);
  for (const auto& b : blocks) REQUIRE(restored.claim(b.addr, b.requested, b.tag));
  REQUIRE(std::string(restored.check_invariants()).empty());
  REQUIRE(restored.free_ranges() == original.free_ranges());
  REQUIRE(restored.small_chunk_count() == original.small_chunk_count());
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 2) {
      const std::size_t k = rng() % live.size();
      REQUIRE(original.release(live[k]));
      REQUIRE(restored.release(live[k]));
      live.erase(live.begin() + k);
    } else {
      const auto size = random_size();
      const auto p = original.allocate(size);
      REQUIRE(restored.allocate(size) == p);
      if (p) live.push_back(*p);
    }
  }
  REQUIRE(std::string(original.check_invariants()).empty());
}

TEST_CASE("a claim may span a small-block chunk's free space and the space beside it", "[allocator]") {
  range_allocator a(base, 1ULL << 30);
  REQUIRE(a.claim(base + 60 * MiB, 1000));  // a small block: its chunk becomes a small-block chunk
  REQUIRE(a.small_chunk_count() == 1);
  const auto beside = *a.allocate(2000);
  REQUIRE(beside == base + 60 * MiB + 1024);  // best fit in that chunk's free space: the 4 MiB above it
  // [base + 62 MiB, base + 70 MiB) lies partly in the chunk, partly outside: both free, so it can be claimed.
  REQUIRE(a.claim(base + 62 * MiB, 8 * MiB));
  REQUIRE_FALSE(a.claim(base + 59 * MiB, 2 * MiB));  // overlaps the small block
  REQUIRE(std::string(a.check_invariants()).empty());
  REQUIRE(a.release(base + 62 * MiB));
  REQUIRE(a.release(base + 60 * MiB));
  REQUIRE(a.small_chunk_count() == 1);
  REQUIRE(a.release(beside));
  REQUIRE(a.small_chunk_count() == 0);
  REQUIRE(a.free_range_count() == 1);  // everything merged again
  REQUIRE(std::string(a.check_invariants()).empty());
}
