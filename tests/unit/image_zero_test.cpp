// Unit tests of zero blocks (image format 6): blocks that hold only zeros are recorded, not stored, and read
// back as zeros, whichever way they were written, in chains, merged, and checked by the rules.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "image_test_support.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/image_chain.hpp"

namespace fs = std::filesystem;
namespace img = vmmckpt::image;
using Catch::Matchers::Contains;

namespace {

using vmmckpt::test::pattern;
using vmmckpt::test::scratch;

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t base0 = 0x200000000000ULL;
constexpr std::uint64_t live = 5 * MiB + 123;  // 6 blocks, the last short

// How the bytes reach the writer.
enum class way { blocks, runs, pieces };

// Bytes with blocks 1 and 3 and the last, short, block all zero, and block 4 zero but for one byte.
std::vector<unsigned char> sparse_bytes() {
  auto v = pattern(live, 7);
  for (const std::uint64_t b : {1, 3, 5}) std::fill(v.begin() + b * MiB, v.begin() + std::min(live, (b + 1) * MiB), 0);
  std::fill(v.begin() + 4 * MiB, v.begin() + 5 * MiB, 0);
  v[4 * MiB + MiB / 2] = 1;
  return v;
}

// An image of one allocation holding `bytes` as one extent, written `how`; with a parent, each block whose
// checksum equals the parent's is left to it, as dump --parent does.
img::manifest write(const fs::path& dir, const std::vector<unsigned char>& bytes, way how,
                    const fs::path& parent = {}) {
  std::optional<img::reader> p;
  if (!parent.empty()) p.emplace(img::reader::open(parent));
  img::manifest m = vmmckpt::test::one_allocation_manifest(base0, bytes.size());
  img::pool& pl = m.pools[0];
  img::writer w(dir);
  const std::uint64_t n = bytes.size();
  w.begin_extent(0, base0, n, n);
  if (how == way::runs) {
    std::vector<std::uint64_t> sums;
    for (std::uint64_t at = 0; at < n; at += img::write_block_size)
      sums.push_back(img::block_checksum(bytes.data() + at, std::min(img::write_block_size, n - at)));
    w.write_blocks(0, bytes.data(), n, sums.data(), sums.size());
  } else if (how == way::pieces) {
    // Pieces that cross block boundaries: a block given whole inside one is still found.
    for (std::uint64_t at = 0; at < n; at += 3 * MiB) w.write(0, bytes.data() + at, std::min(3 * MiB, n - at));
  } else {
    const img::extent* old = p ? &p->info().pools[0].extents[0] : nullptr;
    for (std::uint64_t at = 0; at < n; at += img::write_block_size) {
      const std::size_t k = static_cast<std::size_t>(std::min(img::write_block_size, n - at));
      const std::uint64_t sum = img::block_checksum(bytes.data() + at, k);
      if (old != nullptr && old->blocks[at / img::write_block_size].checksum == sum)
        w.inherit_block(0, k, sum);
      else
        w.write_block(0, bytes.data() + at, k, sum);
    }
  }
  pl.extents.push_back(w.end_extent(0));
  m.data_bytes = img::data_bytes_of(m);
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

std::vector<bool> zero_flags(const img::manifest& m) {
  std::vector<bool> out;
  for (const auto& b : m.pools[0].extents[0].blocks) out.push_back(b.zero);
  return out;
}

std::string validation_error(const img::manifest& m) {
  try {
    img::validate(m);
  } catch (const img::image_error& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("zero blocks: whole blocks of zeros are recorded, not stored, and read back as zeros", "[image][zero]") {
  const auto bytes = sparse_bytes();
  const std::uint64_t zero = 2 * MiB + (live - 5 * MiB);  // blocks 1, 3 and the last; block 4 has a byte
  for (const way how : {way::blocks, way::runs, way::pieces}) {
    scratch s;
    const auto m = write(s / "img", bytes, how);
    INFO("way " << static_cast<int>(how));
    CHECK(m.format == 6);
    CHECK(zero_flags(m) == std::vector<bool>{false, true, false, true, false, true});
    CHECK(img::zero_bytes_of(m) == zero);
    CHECK(m.data_bytes == live - zero);
    CHECK(fs::file_size(s / "img" / "data.bin") == 64 + live - zero);
    const auto r = img::reader::open(s / "img");
    CHECK(r.info().pools[0].extents[0].blocks == m.pools[0].extents[0].blocks);
    r.verify_data();
    CHECK(read_all(r) == bytes);
    // A streaming loader's view: pieces that start and end inside zero blocks.
    const auto& e = r.info().pools[0].extents[0];
    std::vector<unsigned char> got(e.stored);
    r.read_part(e, 0, MiB + 5, got.data());
    r.read_part(e, MiB + 5, 2 * MiB, got.data() + MiB + 5);
    r.read_part(e, 3 * MiB + 5, e.stored - 3 * MiB - 5, got.data() + 3 * MiB + 5);
    CHECK(got == bytes);
    img::streaming_checksum sum(r.info().block_size);
    sum.update(got.data(), got.size());
    r.check_extent(e, sum.value());
    // The JSON form names them, and reads back the same.
    const std::string json = img::to_json(r.info());
    CHECK_THAT(json, Contains("\"zero\": true"));
    CHECK(img::from_json(json).pools[0].extents[0].blocks == e.blocks);
  }
}

TEST_CASE("zero blocks: an extent of zeros only, and a zero block given by the caller", "[image][zero]") {
  scratch s;
  img::writer w(s / "img");
  w.begin_extent(0, base0, 2 * MiB + 10, 2 * MiB + 10);
  w.zero_block(0, MiB);
  const std::vector<unsigned char> zeros(MiB, 0);
  w.write(0, zeros.data(), MiB);  // found as it is written
  w.zero_block(0, 10);
  const img::extent e = w.end_extent(0);
  CHECK(e.blocks.size() == 3);
  for (const auto& b : e.blocks) CHECK(b.zero);
  CHECK(e.blocks[0].checksum == img::zero_block_checksum(MiB));
  CHECK(e.blocks[0].checksum == img::block_checksum(zeros.data(), MiB));
  CHECK(e.blocks[2].checksum == img::block_checksum(zeros.data(), 10));
  // Where a block cannot be: inside one, or longer than what is left.
  w.begin_extent(0, base0 + 4 * MiB, MiB, MiB);
  const std::vector<unsigned char> one(5, 1);
  w.write(0, one.data(), one.size());
  CHECK_THROWS_WITH(w.zero_block(0, MiB), Contains("inside a block"));
}

TEST_CASE("zero blocks: a block zeroed since the parent, and a zero block the child inherits", "[image][zero]") {
  scratch s;
  auto v0 = pattern(live, 3);
  write(s / "full", v0, way::blocks);
  auto v1 = v0;
  std::fill(v1.begin() + 2 * MiB, v1.begin() + 3 * MiB, 0);  // block 2 written, then zeroed again
  const auto m1 = write(s / "inc1", v1, way::blocks, s / "full");
  CHECK(zero_flags(m1) == std::vector<bool>{false, false, true, false, false, false});
  CHECK_FALSE(m1.pools[0].extents[0].blocks[2].in_parent);
  CHECK(m1.data_bytes == 0);
  const auto m2 = write(s / "inc2", v1, way::blocks, s / "inc1");  // nothing changed: every block inherited
  CHECK(zero_flags(m2) == std::vector<bool>(6, false));
  CHECK(m2.pools[0].extents[0].blocks[2].in_parent);
  auto v3 = v1;
  v3[2 * MiB + 9] = 5;  // a zero block of the parent written again
  const auto m3 = write(s / "inc3", v3, way::blocks, s / "inc2");
  CHECK_FALSE(m3.pools[0].extents[0].blocks[2].in_parent);
  CHECK(m3.data_bytes == MiB);

  for (const auto& [name, want] : {std::pair{"inc1", &v1}, {"inc2", &v1}, {"inc3", &v3}}) {
    const auto r = img::reader::open(s / name);
    r.verify_data();
    CHECK(read_all(r) == *want);
  }
  // merge keeps the zero block a zero block, wherever in the chain it was.
  const auto merged = img::merge(img::reader::open(s / "inc2"), s / "merged");
  CHECK(zero_flags(merged) == std::vector<bool>{false, false, true, false, false, false});
  const auto rm = img::reader::open(s / "merged");
  rm.verify_data();
  CHECK(read_all(rm) == v1);
  CHECK(rm.info().data_bytes == live - MiB);
}

TEST_CASE("zero blocks: the rules refuse a zero block that lies", "[image][zero]") {
  scratch s;
  const img::manifest good = write(s / "img", sparse_bytes(), way::blocks);
  CHECK(validation_error(good) == "accepted");
  {
    img::manifest m = good;
    m.pools[0].extents[0].blocks[3].in_parent = true;
    m.parent = img::parent_ref{std::string(32, 'a'), 1, "/elsewhere"};
    CHECK_THAT(validation_error(m), Contains("blocks[3] is both in the parent and a zero block"));
  }
  {
    img::manifest m = good;
    m.format = 5;
    CHECK_THAT(validation_error(m), Contains("which format 5 does not have"));
  }
  {  // data_bytes counts no zero block
    img::manifest m = good;
    m.data_bytes += MiB;
    CHECK_THAT(validation_error(m), Contains("data_bytes"));
  }
}

TEST_CASE("zero blocks: one whose checksum is not that of its zeros is refused where it is read", "[image][zero]") {
  scratch s;
  const auto bytes = sparse_bytes();
  img::manifest m = write(s / "img", bytes, way::blocks);
  auto& e = m.pools[0].extents[0];
  e.blocks[1].checksum ^= 1;
  e.checksum = img::combined_checksum(e.blocks);
  CHECK(validation_error(m) == "accepted");  // the rules hash no zeros a manifest claims
  const img::metadata_files files = img::encode_metadata(m);
  std::ofstream(s / "img" / "manifest.json", std::ios::trunc | std::ios::binary) << files.manifest_json;
  std::ofstream(s / "img" / "tables.bin", std::ios::trunc | std::ios::binary) << files.tables;
  const auto r = img::reader::open(s / "img");
  CHECK_THROWS_WITH(read_all(r), Contains("checksum mismatch in blocks[1]"));
  std::vector<unsigned char> got(e.stored);
  r.read_part(e, 0, e.stored, got.data());  // a streaming loader: its combined checksum differs
  img::streaming_checksum sum(r.info().block_size);
  sum.update(got.data(), got.size());
  CHECK_THROWS_WITH(r.check_extent(e, sum.value()), Contains("checksum mismatch"));
}

TEST_CASE("zero blocks: a format 5 image, which has none, still reads", "[image][zero]") {
  scratch s;
  const auto bytes = pattern(live, 11);
  img::manifest m = write(s / "img", bytes, way::blocks);
  REQUIRE(img::zero_bytes_of(m) == 0);
  m.format = 5;
  const img::metadata_files files = img::encode_metadata(m);
  std::ofstream(s / "img" / "manifest.json", std::ios::trunc | std::ios::binary) << files.manifest_json;
  std::ofstream(s / "img" / "tables.bin", std::ios::trunc | std::ios::binary) << files.tables;
  {  // the data file's header says its format too
    std::fstream data(s / "img" / "data.bin", std::ios::in | std::ios::out | std::ios::binary);
    data.seekp(12);
    data.put(5);
  }
  const auto r = img::reader::open(s / "img");
  CHECK(r.info().format == 5);
  CHECK(read_all(r) == bytes);
}
