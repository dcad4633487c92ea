// Unit tests of incremental images: block checksums, chains of parents, refusals, merge, children.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "image_test_support.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/image_chain.hpp"

namespace fs = std::filesystem;
namespace img = vmmckpt::image;
using Catch::Matchers::Contains;

namespace {

using vmmckpt::test::flip_byte;
using vmmckpt::test::pattern;
using vmmckpt::test::scratch;

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t base0 = 0x200000000000ULL;
constexpr std::uint64_t live = 5 * MiB + 123;  // 6 blocks, the last short

// An image of one allocation holding `bytes` as two extents (as a dump cuts a big allocation); with
// a parent, each block equal to the parent's is left to it, as dump --parent does.
// With `runs`, every block of an extent in one write_blocks call instead of block by block.
img::manifest write(const fs::path& dir, const std::vector<unsigned char>& bytes, const fs::path& parent = {},
                    bool runs = false) {
  std::optional<img::reader> p;
  if (!parent.empty()) p.emplace(img::reader::open(parent));
  img::manifest m = vmmckpt::test::one_allocation_manifest(base0, bytes.size());
  img::pool& pl = m.pools[0];
  img::writer w(dir);
  const std::uint64_t cut = 3 * MiB;
  for (const auto& [from, to] : {std::pair<std::uint64_t, std::uint64_t>{0, cut}, {cut, bytes.size()}}) {
    const std::uint64_t n = to - from;
    w.begin_extent(0, base0 + from, n, n);
    const img::extent* old = p ? &p->info().pools[0].extents[from == 0 ? 0 : 1] : nullptr;
    if (runs) {
      std::vector<std::uint64_t> sums;
      for (std::uint64_t at = 0; at < n; at += img::write_block_size)
        sums.push_back(img::block_checksum(bytes.data() + from + at, std::min(img::write_block_size, n - at)));
      w.write_blocks(0, bytes.data() + from, n, sums.data(), sums.size());
    } else {
      for (std::uint64_t at = 0; at < n; at += img::write_block_size) {
        const std::size_t k = static_cast<std::size_t>(std::min(img::write_block_size, n - at));
        const std::uint64_t sum = img::block_checksum(bytes.data() + from + at, k);
        if (old != nullptr && old->blocks[at / img::write_block_size].checksum == sum)
          w.inherit_block(0, k, sum);
        else
          w.write_block(0, bytes.data() + from + at, k, sum);
      }
    }
    pl.extents.push_back(w.end_extent(0));
  }
  for (const auto& e : m.pools[0].extents) m.data_bytes += img::bytes_here(e, m.block_size);
  if (p) m.parent = img::parent_ref{p->info().image_id, p->manifest_checksum(), fs::absolute(parent).string()};
  w.commit(m);
  m.image_id = w.image_id();
  return m;
}

std::vector<unsigned char> read_all(const img::reader& r) {
  std::vector<unsigned char> out;
  r.read_range(base0, live, [&](const unsigned char* b, std::size_t n) { out.insert(out.end(), b, b + n); });
  return out;
}

std::string open_error(const fs::path& dir) {
  try {
    const auto r = img::reader::open(dir);
    r.verify_data();
  } catch (const img::image_error& e) {
    return e.what();
  }
  return "accepted";
}

std::size_t blocks_in_parent(const img::manifest& m) {
  std::size_t n = 0;
  for (const auto& e : m.pools[0].extents)
    for (const auto& b : e.blocks) n += b.in_parent;
  return n;
}

}  // namespace

TEST_CASE("chain: full, one block changed, nothing changed; every image reads back its own bytes", "[image][chain]") {
  scratch s;
  auto v0 = pattern(live, 1);
  const auto m0 = write(s / "full", v0);
  CHECK_FALSE(m0.parent);
  CHECK(blocks_in_parent(m0) == 0);
  auto v1 = v0;
  v1[4 * MiB + 7] ^= 0xff;  // block 1 of the second extent
  const auto m1 = write(s / "inc1", v1, s / "full");
  CHECK(blocks_in_parent(m1) == 5);
  CHECK(m1.data_bytes == MiB);
  const auto m2 = write(s / "inc2", v1, s / "inc1");
  CHECK(blocks_in_parent(m2) == 6);
  CHECK(m2.data_bytes == 0);

  const auto r2 = img::reader::open(s / "inc2");
  REQUIRE(r2.parent() != nullptr);
  REQUIRE(r2.parent()->parent() != nullptr);
  CHECK(r2.parent()->parent()->parent() == nullptr);
  CHECK(r2.parent()->info().image_id == m1.image_id);
  r2.verify_data();
  CHECK(read_all(r2) == v1);
  CHECK(read_all(img::reader::open(s / "inc1")) == v1);
  CHECK(read_all(img::reader::open(s / "full")) == v0);
  // A streaming loader's view: read_part across the chain, checked with the combined checksum.
  for (const auto& e : r2.info().pools[0].extents) {
    std::vector<unsigned char> got(e.stored);
    r2.read_part(e, 0, 100, got.data());
    r2.read_part(e, 100, e.stored - 100, got.data() + 100);
    img::streaming_checksum sum(r2.info().block_size);
    sum.update(got.data(), got.size());
    r2.check_extent(e, sum.value());
    CHECK(std::vector<unsigned char>(v1.begin() + (e.addr - base0), v1.begin() + (e.addr - base0) + e.stored) == got);
  }

  // merge: a full image of the same bytes and block checksums, with no parent.
  const auto merged = img::merge(r2, s / "merged");
  CHECK_FALSE(merged.parent);
  const auto rm = img::reader::open(s / "merged");
  CHECK(rm.parent() == nullptr);
  rm.verify_data();
  CHECK(read_all(rm) == v1);
  CHECK(rm.info().data_bytes == live);
  for (std::size_t k = 0; k < 2; ++k) {
    const auto& a = rm.info().pools[0].extents[k];
    const auto& b = r2.info().pools[0].extents[k];
    CHECK(a.checksum == b.checksum);
    REQUIRE(a.blocks.size() == b.blocks.size());
    for (std::size_t i = 0; i < a.blocks.size(); ++i) {
      CHECK(a.blocks[i].checksum == b.blocks[i].checksum);
      CHECK_FALSE(a.blocks[i].in_parent);
    }
  }
  CHECK_THROWS_WITH(img::merge(r2, s / "merged"), Contains("already exists"));
  // The children of an image, among its siblings: what `cuda-ckpt rm` refuses to orphan.
  CHECK(img::children_in(s.dir, m0.image_id) == std::vector<fs::path>{s / "inc1"});
  CHECK(img::children_in(s.dir, m1.image_id) == std::vector<fs::path>{s / "inc2"});
  CHECK(img::children_in(s.dir, m2.image_id).empty());
}

TEST_CASE("image: a run of blocks written at once makes the image written block by block", "[image][chain]") {
  scratch s;
  const auto bytes = pattern(live, 3);
  const auto one_by_one = write(s / "blocks", bytes);
  const auto at_once = write(s / "runs", bytes, {}, true);
  REQUIRE(at_once.pools[0].extents.size() == one_by_one.pools[0].extents.size());
  for (std::size_t e = 0; e < at_once.pools[0].extents.size(); ++e) {
    const auto& a = at_once.pools[0].extents[e];
    const auto& b = one_by_one.pools[0].extents[e];
    CHECK(a.checksum == b.checksum);
    CHECK(a.blocks == b.blocks);
  }
  const auto r = img::reader::open(s / "runs");
  r.verify_data();
  CHECK(read_all(r) == bytes);

  // Not whole blocks (and not the extent's end), or not one checksum per block: refused, naming what is wrong.
  const std::vector<std::uint64_t> sums(4, 0);
  {
    img::writer w(s / "half");
    w.begin_extent(0, base0, 3 * MiB + 5, 3 * MiB + 5);
    CHECK_THROWS_WITH(w.write_blocks(0, bytes.data(), MiB + MiB / 2, sums.data(), 2), Contains("are not whole blocks"));
  }
  {
    img::writer w(s / "count");
    w.begin_extent(0, base0, 3 * MiB + 5, 3 * MiB + 5);
    CHECK_THROWS_WITH(w.write_blocks(0, bytes.data(), 2 * MiB, sums.data(), 3),
                      Contains("3 checksums for 2097152 bytes"));
  }
  {
    img::writer w(s / "single");
    w.begin_extent(0, base0, 3 * MiB + 5, 3 * MiB + 5);
    CHECK_THROWS_WITH(w.write_block(0, bytes.data(), 2 * MiB, 0), Contains("are not the next block"));
  }
}

TEST_CASE("chain: a missing, changed or broken parent is refused, naming it and the child", "[image][chain]") {
  scratch s;
  const auto v0 = pattern(live, 2);
  auto v1 = v0;
  v1[10] ^= 1;
  write(s / "full", v0);
  write(s / "inc", v1, s / "full");
  REQUIRE(open_error(s / "inc") == "accepted");

  SECTION("missing") {
    fs::rename(s / "full", s / "elsewhere");
    const std::string e = open_error(s / "inc");
    CHECK_THAT(e, Contains((s / "inc").string() + ": its parent " + (s / "full").string()));
    CHECK_THAT(e, Contains("is missing: it is not at " + (s / "full").string()));
  }
  SECTION("missing, with the same name as the child: the child is not taken for its own parent") {
    fs::create_directories(s / "a");
    fs::create_directories(s / "b");
    write(s / "a" / "x", v0);
    write(s / "b" / "x", v1, s / "a" / "x");
    fs::rename(s / "a" / "x", s / "a" / "gone");
    const std::string e = open_error(s / "b" / "x");
    CHECK_THAT(e, Contains("is missing: it is not at " + (s / "a" / "x").string()));
    const img::parent_ref ref{"", 0, (s / "a" / "x").string()};
    CHECK(img::parent_candidates(s / "b" / "x", ref) == std::vector<fs::path>{(s / "a" / "x").lexically_normal()});
  }
  SECTION("missing where it was recorded, and another image of its name beside the child: not taken, named") {
    fs::create_directories(s / "a");
    fs::create_directories(s / "b");
    write(s / "a" / "p", v0);
    write(s / "b" / "x", v1, s / "a" / "p");
    write(s / "b" / "p", v0);  // the same bytes, another image
    fs::rename(s / "a" / "p", s / "a" / "gone");
    const std::string e = open_error(s / "b" / "x");
    CHECK_THAT(e, Contains("is missing: it is not at " + (s / "a" / "p").string() + ", " + (s / "b" / "p").string() +
                           " (image "));
    CHECK_THAT(e, Contains(", another)"));
  }
  SECTION("changed: another image under its name") {
    fs::remove_all(s / "full");
    write(s / "full", v0);  // the same bytes, but another image
    const std::string e = open_error(s / "inc");
    CHECK_THAT(e, Contains("has changed: " + (s / "full").string() + " is image "));
  }
  SECTION("changed: its manifest edited") {
    const fs::path mf = s / "full" / "manifest.json";
    std::string text;
    {
      std::ifstream in(mf);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto at = text.find(R"("host": "node")");
    REQUIRE(at != std::string::npos);
    text.replace(at, 14, R"("host": "nodf")");
    std::ofstream(mf, std::ios::trunc) << text;
    CHECK_THAT(open_error(s / "inc"), Contains("has changed: " + (s / "full").string() + "/manifest.json hashes to"));
  }
  SECTION("broken: its tables damaged") {
    flip_byte(s / "full" / "tables.bin", 70);
    const std::string e = open_error(s / "inc");
    CHECK_THAT(e, Contains((s / "inc").string() + ": its parent"));
    CHECK_THAT(e, Contains("is broken, found at " + (s / "full").string() + ": "));
    CHECK_THAT(e, Contains("tables.bin: checksum mismatch"));
  }
  SECTION("broken: a block the child takes from it damaged") {
    flip_byte(s / "full" / "data.bin", 64 + 4 * MiB + 5);
    const std::string e = open_error(s / "inc");
    CHECK_THAT(e, Contains("(the parent of " + (s / "inc").string() + ")"));
    CHECK_THAT(e, Contains("extents[1] at 0x200000300000: checksum mismatch in blocks[1]"));
  }
  SECTION("broken: a block the grandchild takes from two images up damaged: that image is named") {
    write(s / "inc2", v1, s / "inc");
    REQUIRE(open_error(s / "inc2") == "accepted");
    flip_byte(s / "full" / "data.bin", 64 + 4 * MiB + 5);
    const std::string e = open_error(s / "inc2");
    CHECK_THAT(e, Contains((s / "full" / "data.bin").string() + " (an ancestor of " + (s / "inc2").string() +
                           ", 2 images up its chain)"));
    CHECK_THAT(e, Contains("checksum mismatch in blocks[1]"));
  }
  SECTION("moved together with its child: found next to it") {
    fs::create_directory(s / "moved");
    fs::rename(s / "full", s / "moved" / "full");
    fs::rename(s / "inc", s / "moved" / "inc");
    const auto r = img::reader::open(s / "moved" / "inc");
    r.verify_data();
    CHECK(r.parent()->dir() == s / "moved" / "full");
    CHECK(read_all(r) == v1);
  }
}

TEST_CASE("chain: a parent reference is checked like every field", "[image][chain]") {
  scratch s;
  const auto v0 = pattern(live, 3);
  const auto m = write(s / "full", v0);
  auto refused = [&](const std::function<void(img::manifest&)>& spoil) {
    img::manifest x = m;
    spoil(x);
    try {
      img::validate(x);
    } catch (const img::image_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refused([](img::manifest&) {}) == "accepted");
  CHECK_THAT(refused([](img::manifest& x) { x.pools[0].extents[0].blocks[0].in_parent = true; }),
             Contains("pools[0].extents[0].blocks[0] is in the parent, but the image has none"));
  CHECK_THAT(refused([](img::manifest& x) {
               x.parent = img::parent_ref{"nothex", 1, "/x"};
             }),
             Contains("parent.image_id \"nothex\" is not 32 lowercase hex digits"));
  CHECK_THAT(refused([&](img::manifest& x) {
               x.parent = img::parent_ref{m.image_id, 1, "/x"};
             }),
             Contains("parent.image_id is the image's own image_id"));
  CHECK_THAT(refused([](img::manifest& x) {
               x.parent = img::parent_ref{std::string(32, 'a'), 1, ""};
             }),
             Contains("parent.path is empty"));
  CHECK_THAT(refused([](img::manifest& x) { x.pools[0].extents[0].blocks.pop_back(); }),
             Contains("pools[0].extents[0] has 2 blocks, expected 3"));
  CHECK_THAT(refused([](img::manifest& x) { x.pools[0].extents[1].blocks[0].checksum ^= 1; }),
             Contains("pools[0].extents[1].checksum"));
  CHECK_THAT(refused([](img::manifest& x) { x.block_size = 3 * MiB; }),
             Contains("block_size 3145728 is not a power of two"));
  // In JSON, and back.
  img::manifest with_parent = m;
  with_parent.parent = img::parent_ref{std::string(32, 'b'), 0x1234, "/images/full"};
  CHECK(img::from_json(img::to_json(with_parent)) == with_parent);
}

TEST_CASE("chain: longer than max_chain_length images is refused, and merge makes it one", "[image][chain]") {
  scratch s;
  auto v = pattern(live, 4);
  write(s / "i0", v);
  for (std::size_t k = 1; k < img::max_chain_length; ++k) {
    v[(k % 6) * MiB] ^= 1;
    write(s / ("i" + std::to_string(k)), v, s / ("i" + std::to_string(k - 1)));
  }
  const std::string last = "i" + std::to_string(img::max_chain_length - 1);
  // 32 images: the longest chain a reader follows.
  const auto r = img::reader::open(s / last);
  CHECK(read_all(r) == v);
  img::merge(r, s / "full");
  v[7] ^= 1;
  write(s / "too-long", v, s / last);  // 33: the writer could still open its parent chain of 32
  CHECK_THAT(open_error(s / "too-long"), Contains("the chain of parents is longer than 32 images"));
  // Merged, it is a parent like any other.
  write(s / "after-merge", v, s / "full");
  CHECK(read_all(img::reader::open(s / "after-merge")) == v);
}
