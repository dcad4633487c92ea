// Unit tests of the copy's plan (ckpt/src/copy/copy_plan.hpp): chunks, spans and pieces from a manifest, packing,
// runs of blocks, the GPU snapshot's layout and the runs that leave the program's memory. No GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "copy/copy_plan.hpp"
#include "vmmckpt/image/image.hpp"

using namespace vmmckpt;
using ckpt::chunk;
using ckpt::span;

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t KiB = 1ULL << 10;

image::manifest manifest_of(const std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>>& pools) {
  image::manifest m;
  for (const auto& allocations : pools) {
    image::pool p;
    for (const auto& [addr, size] : allocations) p.allocations.push_back({addr, size});
    m.pools.push_back(p);
  }
  return m;
}

const auto everything_mapped = [](std::uint64_t, std::uint64_t) { return true; };
const auto nothing_mapped = [](std::uint64_t, std::uint64_t) { return false; };

}  // namespace

TEST_CASE("plan: small allocations near each other are joined into one span with their gaps", "[copy_plan]") {
  auto m = manifest_of({{{0x1000000, 4 * KiB}, {0x1002000, 4 * KiB}, {0x1010000, 8 * KiB}}});
  const auto chunks = ckpt::plan_chunks(m, 32 * MiB, 4, everything_mapped);
  REQUIRE(chunks.size() == 1);
  REQUIRE(chunks[0].spans.size() == 1);
  const span& sp = chunks[0].spans[0];
  CHECK(sp.addr == 0x1000000);
  CHECK(sp.size == 0x10000 + 8 * KiB);  // gaps included
  CHECK(sp.stored == 16 * KiB);         // the allocations' bytes only
  CHECK(sp.piece_count == 3);
  CHECK(chunks[0].bytes == sp.size);
  CHECK(chunks[0].pieces[1].offset == 0x2000);
  CHECK(chunks[0].pieces[2].offset == 0x10000);
  REQUIRE(m.pools[0].extents.size() == 1);
  CHECK(m.pools[0].extents[0].addr == sp.addr);
  CHECK(m.pools[0].extents[0].size == sp.size);
  CHECK(m.pools[0].extents[0].stored == sp.stored);
  CHECK(m.data_files == 4);
  CHECK(ckpt::stored_bytes(chunks) == 16 * KiB);
}

TEST_CASE("plan: no join over unmapped memory, a gap too large, across pools, or with a large allocation",
          "[copy_plan]") {
  SECTION("unmapped gap") {
    auto m = manifest_of({{{0x1000000, 4 * KiB}, {0x1002000, 4 * KiB}}});
    const auto chunks = ckpt::plan_chunks(m, 32 * MiB, 1, nothing_mapped);
    REQUIRE(chunks.size() == 1);
    CHECK(chunks[0].spans.size() == 2);
    CHECK(chunks[0].bytes == 8 * KiB);  // packed one after the other in the buffer
  }
  SECTION("gap over max_gap") {
    auto m = manifest_of({{{0x1000000, 4 * KiB}, {0x1000000 + 4 * KiB + ckpt::max_gap + 1, 4 * KiB}}});
    const auto chunks = ckpt::plan_chunks(m, 32 * MiB, 1, everything_mapped);
    CHECK(chunks[0].spans.size() == 2);
  }
  SECTION("two pools") {
    auto m = manifest_of({{{0x1000000, 4 * KiB}}, {{0x1002000, 4 * KiB}}});
    const auto chunks = ckpt::plan_chunks(m, 32 * MiB, 1, everything_mapped);
    REQUIRE(chunks[0].spans.size() == 2);
    CHECK(chunks[0].spans[0].pool == 0);
    CHECK(chunks[0].spans[1].pool == 1);
    CHECK(m.pools[0].extents.size() == 1);
    CHECK(m.pools[1].extents.size() == 1);
  }
  SECTION("a large allocation is a span of its own") {
    auto m = manifest_of({{{0x1000000, ckpt::join_below}, {0x1000000 + ckpt::join_below, 4 * KiB}}});
    const auto chunks = ckpt::plan_chunks(m, 32 * MiB, 1, everything_mapped);
    REQUIRE(chunks[0].spans.size() == 2);
    CHECK_FALSE(chunks[0].spans[0].joinable);
    CHECK(chunks[0].spans[1].joinable);
  }
}

TEST_CASE("plan: a large allocation is cut at the chunk size, in manifest order", "[copy_plan]") {
  auto m = manifest_of({{{0x10000000, 5 * MiB}, {0x20000000, 1 * MiB}}});
  const auto chunks = ckpt::plan_chunks(m, 2 * MiB, 2, everything_mapped);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].bytes == 2 * MiB);
  CHECK(chunks[1].bytes == 2 * MiB);
  REQUIRE(chunks[2].spans.size() == 2);  // the last MiB of the first and the second allocation
  CHECK(chunks[2].spans[0].addr == 0x10000000 + 4 * MiB);
  CHECK(chunks[2].spans[1].addr == 0x20000000);
  CHECK(chunks[2].spans[1].offset == 1 * MiB);
  REQUIRE(m.pools[0].extents.size() == 4);  // the first allocation's three pieces, and the second
  CHECK(m.pools[0].extents[1].addr == 0x10000000 + 2 * MiB);
  CHECK(m.pools[0].extents[2].size == 1 * MiB);
  CHECK(m.pools[0].extents[3].addr == 0x20000000);
  CHECK(ckpt::stored_bytes(chunks) == 6 * MiB);
}

TEST_CASE("plan: nothing to copy is no chunk", "[copy_plan]") {
  auto m = manifest_of({{}});
  CHECK(ckpt::plan_chunks(m, 2 * MiB, 3, everything_mapped).empty());
  CHECK(m.data_files == 3);
}

TEST_CASE("pack: a span's pieces are moved together, its gaps left out", "[copy_plan]") {
  auto m = manifest_of({{{0x1000, 4}, {0x1008, 4}, {0x1010, 2}}});
  const auto chunks = ckpt::plan_chunks(m, 1 * MiB, 1, everything_mapped);
  REQUIRE(chunks.size() == 1);
  REQUIRE(chunks[0].spans.size() == 1);
  std::vector<unsigned char> buffer(chunks[0].bytes);
  std::iota(buffer.begin(), buffer.end(), 0);  // byte k at offset k
  const unsigned char* packed = ckpt::pack(buffer.data(), chunks[0], chunks[0].spans[0]);
  const std::vector<unsigned char> want = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17};
  CHECK(std::vector<unsigned char>(packed, packed + chunks[0].spans[0].stored) == want);
}

TEST_CASE("block runs: the longest runs of unchanged, zero and changed blocks", "[copy_plan]") {
  const std::uint64_t bs = image::write_block_size;
  using ckpt::block_fate;
  using run = std::tuple<std::size_t, std::size_t, block_fate, std::uint64_t, std::uint64_t>;
  image::extent old;
  old.blocks = {{1}, {2}, {3}, {4}};
  const std::uint64_t sums[] = {1, 9, 9, 4};
  std::vector<run> runs;
  const std::uint64_t stored = 3 * bs + 100;
  auto collect = [&](std::size_t first, std::size_t end, block_fate fate, std::uint64_t from, std::uint64_t to) {
    runs.emplace_back(first, end, fate, from, to);
  };
  ckpt::for_each_block_run(sums, nullptr, &old, stored, collect);
  REQUIRE(runs.size() == 3);
  CHECK(runs[0] == run{0, 1, block_fate::parent, 0, bs});
  CHECK(runs[1] == run{1, 3, block_fate::copy, bs, 3 * bs});
  CHECK(runs[2] == run{3, 4, block_fate::parent, 3 * bs, stored});
  runs.clear();
  ckpt::for_each_block_run(sums, nullptr, nullptr, stored, collect);
  REQUIRE(runs.size() == 1);  // without a parent every block differs
  CHECK(runs[0] == run{0, 4, block_fate::copy, 0, stored});

  SECTION("zero flags: a zero block unchanged since the parent is left to it, one changed is a zero block") {
    const unsigned char zeros[] = {1, 1, 0, 1};
    runs.clear();
    ckpt::for_each_block_run(sums, zeros, &old, stored, collect);
    REQUIRE(runs.size() == 4);
    CHECK(runs[0] == run{0, 1, block_fate::parent, 0, bs});
    CHECK(runs[1] == run{1, 2, block_fate::zero, bs, 2 * bs});
    CHECK(runs[2] == run{2, 3, block_fate::copy, 2 * bs, 3 * bs});
    CHECK(runs[3] == run{3, 4, block_fate::parent, 3 * bs, stored});
    runs.clear();
    ckpt::for_each_block_run(sums, zeros, nullptr, stored, collect);
    REQUIRE(runs.size() == 3);
    CHECK(runs[0] == run{0, 2, block_fate::zero, 0, 2 * bs});
    CHECK(runs[1] == run{2, 3, block_fate::copy, 2 * bs, 3 * bs});
    CHECK(runs[2] == run{3, 4, block_fate::zero, 3 * bs, stored});  // the last, shorter block too
  }
}

TEST_CASE("snapshot: the last chunks that fit, and where they lie in it", "[copy_plan]") {
  const std::vector<std::uint64_t> bytes = {4, 3, 2, 1};
  auto of = [&](std::size_t c) { return bytes[c]; };
  CHECK(ckpt::first_in_snapshot(4, 0, of) == 4);   // no room: none
  CHECK(ckpt::first_in_snapshot(4, 3, of) == 2);   // 1 + 2
  CHECK(ckpt::first_in_snapshot(4, 5, of) == 2);   // 1 + 2, and 3 does not fit in the 2 left
  CHECK(ckpt::first_in_snapshot(4, 10, of) == 0);  // all
  CHECK(ckpt::first_in_snapshot(2, 10, of) == 0);  // going back from chunk 2: 3 + 4
  std::vector<chunk> chunks(3);
  chunks[0].bytes = 10;
  chunks[1].bytes = 20;
  chunks[2].bytes = 30;
  CHECK(ckpt::snapshot_places(chunks, 1, 1000) == std::vector<CUdeviceptr>{0, 1000, 1020});
  CHECK(ckpt::snapshot_places(chunks, 3, 1000) == std::vector<CUdeviceptr>{0, 0, 0});
}

TEST_CASE("copy runs: whole spans without checksums; with them only the changed blocks", "[copy_plan]") {
  const std::uint64_t bs = image::write_block_size;
  auto m = manifest_of({{{0x100000000, 3 * bs}}, {{0x200000000, 2 * bs}}});
  const auto chunks = ckpt::plan_chunks(m, 3 * bs, 1, everything_mapped);
  REQUIRE(chunks.size() == 2);
  const std::vector<CUdeviceptr> nowhere(chunks.size(), 0);

  SECTION("no checksums: every span whole") {
    const auto runs =
        ckpt::plan_copy_runs(chunks, nowhere, [](std::size_t, std::size_t) { return ckpt::span_blocks{}; });
    CHECK(runs.changed_chunks == 2);
    CHECK(runs.changed_bytes == 5 * bs);
    CHECK(runs.uncopied_bytes == 0);
    REQUIRE(runs.of[0].size() == 1);
    CHECK(runs.of[0][0].addr == 0x100000000);
    CHECK(runs.of[0][0].bytes == 3 * bs);
    CHECK(runs.of[0][0].in_snapshot == 0);
  }
  SECTION("checksums and a parent: the changed runs, an unchanged chunk has none") {
    image::extent old0, old1;
    old0.blocks = {{1}, {2}, {3}};
    old1.blocks = {{7}, {8}};
    const std::uint64_t sums0[] = {1, 5, 3};  // the middle block changed
    const std::uint64_t sums1[] = {7, 8};     // nothing changed
    const std::vector<CUdeviceptr> snapshot_at = {0, 5000};
    const auto runs = ckpt::plan_copy_runs(chunks, snapshot_at, [&](std::size_t c, std::size_t) {
      return c == 0 ? ckpt::span_blocks{sums0, nullptr, &old0} : ckpt::span_blocks{sums1, nullptr, &old1};
    });
    CHECK(runs.changed_chunks == 1);
    CHECK(runs.changed_bytes == bs);
    CHECK(runs.uncopied_bytes == 4 * bs);
    REQUIRE(runs.of[0].size() == 1);
    CHECK(runs.of[0][0].addr == 0x100000000 + bs);
    CHECK(runs.of[0][0].offset == bs);
    CHECK(runs.of[1].empty());
    CHECK(runs.bytes_of(0) == bs);
    CHECK(runs.bytes_of(1) == 0);
  }
  SECTION("zero flags without a parent: the zero blocks are not copied, a chunk all zeros has no run") {
    const std::uint64_t sums0[] = {1, 2, 3}, sums1[] = {4, 5};
    const unsigned char zeros0[] = {0, 1, 0}, zeros1[] = {1, 1};
    const auto runs = ckpt::plan_copy_runs(chunks, nowhere, [&](std::size_t c, std::size_t) {
      return c == 0 ? ckpt::span_blocks{sums0, zeros0, nullptr} : ckpt::span_blocks{sums1, zeros1, nullptr};
    });
    CHECK(runs.changed_chunks == 1);
    CHECK(runs.changed_bytes == 2 * bs);
    CHECK(runs.uncopied_bytes == 0);
    REQUIRE(runs.of[0].size() == 2);
    CHECK(runs.of[0][0].addr == 0x100000000);
    CHECK(runs.of[0][0].bytes == bs);
    CHECK(runs.of[0][1].addr == 0x100000000 + 2 * bs);
    CHECK(runs.of[0][1].offset == 2 * bs);
    CHECK(runs.of[1].empty());
  }
  SECTION("runs placed in a snapshot one after the other") {
    auto runs = ckpt::plan_copy_runs(chunks, nowhere, [](std::size_t, std::size_t) { return ckpt::span_blocks{}; });
    runs.place_in_snapshot(0, 1 << 30);
    CHECK(runs.of[0][0].in_snapshot == (1 << 30));
    CHECK(runs.of[1][0].in_snapshot == (1 << 30) + 3 * bs);
  }
}
