// Unit tests of images with several data files (format 2), written from several threads, and of reading format 1.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "image_test_support.hpp"
#include "vmmckpt/image/image.hpp"

namespace fs = std::filesystem;
namespace img = vmmckpt::image;
using Catch::Matchers::Contains;

namespace {

using vmmckpt::test::pattern;
using vmmckpt::test::scratch;

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t base0 = 0x200000000000ULL;

img::manifest skeleton() {
  img::manifest m;
  m.tool_version = "test";
  m.created = "2026-11-22T10:00:00Z";
  m.host = "h";
  m.pid = 7;
  m.devices = {{0, "GPU", "GPU-11111111-2222-3333-4444-555555555555", 9, 0}};
  img::pool p;
  p.device = 0;
  p.base = base0;
  p.size = 1ULL << 36;
  p.granularity = 2 * MiB;
  m.pools.push_back(p);
  return m;
}

std::vector<unsigned char> bytes_for(std::uint64_t addr, std::uint64_t size) {
  std::mt19937_64 rng(addr);
  std::vector<unsigned char> v(size);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// One allocation of `extents` pieces of `piece` bytes, piece k in data file k % files, each file
// written by its own thread, as the dump engine does.
img::manifest write_striped(const fs::path& dir, std::uint32_t files, int extents, std::uint64_t piece) {
  img::manifest m = skeleton();
  m.data_files = files;
  m.pools[0].allocations.push_back({base0, piece * extents, vmmckpt::alloc_api::cuda_malloc});
  img::writer w(dir, files);
  std::vector<img::extent> done(extents);
  std::vector<std::thread> threads;
  for (std::uint32_t f = 0; f < files; ++f)
    threads.emplace_back([&, f] {
      for (int k = static_cast<int>(f); k < extents; k += static_cast<int>(files)) {
        const std::uint64_t addr = base0 + k * piece;
        const auto data = bytes_for(addr, piece);
        w.begin_extent(f, addr, piece);
        w.write(f, data.data(), piece / 3);
        w.write(f, data.data() + piece / 3, piece - piece / 3);
        done[k] = w.end_extent(f);
      }
    });
  for (auto& t : threads) t.join();
  m.pools[0].extents = done;
  for (const auto& e : done) m.data_bytes += e.size;
  w.commit(m);
  m.image_id = w.image_id();
  return m;
}

// The damage these tests make: bit 4 of a byte.
void flip_byte(const fs::path& file, std::uint64_t offset) { vmmckpt::test::flip_byte(file, offset, 0x10); }

}  // namespace

TEST_CASE("extents written to several data files from several threads read back whole") {
  scratch s;
  const fs::path dir = s.dir / "img";
  const auto m = write_striped(dir, 4, 10, 3 * MiB + 5);
  for (std::uint32_t f = 0; f < 4; ++f)
    CHECK(fs::exists(dir / (f == 0 ? "data.bin" : "data." + std::to_string(f) + ".bin")));
  CHECK_FALSE(fs::exists(dir / "data.4.bin"));
  const auto r = img::reader::open(dir);
  CHECK(r.info() == m);
  CHECK(r.info().data_files == 4);
  r.verify_data();
  r.verify_data(1);
  for (const auto& e : r.info().pools[0].extents) {
    std::vector<unsigned char> got(e.size);
    r.read(e, got.data());
    CHECK(got == bytes_for(e.addr, e.size));
    // A loader that streams an extent checks it the same way.
    img::streaming_checksum sum(r.info().block_size);
    sum.update(got.data(), 100);
    sum.update(got.data() + 100, got.size() - 100);
    r.check_extent(e, sum.value());
    CHECK_THROWS_WITH(r.check_extent(e, sum.value() ^ 1), Contains("checksum mismatch"));
  }
}

TEST_CASE("extents spread unevenly over the data files are taken the files in turn") {
  // As the dump's writers take chunks: whichever writer is free takes the next, so files differ
  // in size, one may stay empty, and each file's extents still come in manifest order.
  scratch s;
  const fs::path dir = s.dir / "img";
  const std::vector<std::uint32_t> file_of = {0, 1, 0, 0, 1, 0};
  const std::uint64_t piece = 1 * MiB + 3;
  img::manifest m = skeleton();
  m.data_files = 3;
  m.pools[0].allocations.push_back({base0, piece * file_of.size(), vmmckpt::alloc_api::cuda_malloc});
  {
    img::writer w(dir, 3);
    for (std::size_t k = 0; k < file_of.size(); ++k) {
      const std::uint64_t addr = base0 + k * piece;
      const auto data = bytes_for(addr, piece);
      w.begin_extent(file_of[k], addr, piece);
      w.write(file_of[k], data.data(), piece);
      m.pools[0].extents.push_back(w.end_extent(file_of[k]));
      m.data_bytes += piece;
    }
    w.commit(m);
  }
  const auto r = img::reader::open(dir);
  const std::vector<std::pair<std::size_t, std::size_t>> expected = {{0, 0}, {0, 1}, {0, 2}, {0, 4}, {0, 3}, {0, 5}};
  CHECK(r.extents_across_files() == expected);
  r.verify_data();
  r.verify_data(2);
  flip_byte(dir / "data.1.bin", fs::file_size(dir / "data.1.bin") - 1);  // the last byte of extent 4
  CHECK_THROWS_WITH(r.verify_data(), Contains("checksum mismatch"));
}

TEST_CASE("a damaged byte in any data file is found and named") {
  scratch s;
  const fs::path dir = s.dir / "img";
  write_striped(dir, 3, 6, MiB);
  flip_byte(dir / "data.2.bin", 64 + MiB + 17);  // the second extent of file 2
  const auto r = img::reader::open(dir);
  CHECK_THROWS_WITH(r.verify_data(),
                    Contains("data.2.bin") && Contains("pools[0].extents[5]") && Contains("checksum mismatch"));
}

TEST_CASE("a data file that is missing, swapped, or extra in the manifest is refused") {
  scratch s;
  const fs::path dir = s.dir / "img";
  write_striped(dir, 3, 6, MiB);
  SECTION("missing") {
    fs::remove(dir / "data.1.bin");
    CHECK_THROWS_WITH(img::reader::open(dir), Contains("data.1.bin") && Contains("missing"));
  }
  SECTION("two files swapped") {
    fs::rename(dir / "data.1.bin", dir / "tmp");
    fs::rename(dir / "data.2.bin", dir / "data.1.bin");
    fs::rename(dir / "tmp", dir / "data.2.bin");
    CHECK_THROWS_WITH(img::reader::open(dir), Contains("data file 2 of 3, expected 1 of 3"));
  }
  SECTION("an extent naming a file the image does not have") {
    auto m = img::reader::open(dir).info();
    m.pools[0].extents[0].file = 3;
    CHECK_THROWS_WITH(img::validate(m), Contains("pools[0].extents[0].file is 3") && Contains("3 data files"));
  }
  SECTION("offsets that are not back to back within a file") {
    auto m = img::reader::open(dir).info();
    std::swap(m.pools[0].extents[0].offset, m.pools[0].extents[3].offset);  // both in file 0
    CHECK_THROWS_WITH(img::validate(m), Contains("pools[0].extents[0].offset"));
  }
  SECTION("data_files out of range") {
    auto m = img::reader::open(dir).info();
    m.data_files = 0;
    CHECK_THROWS_WITH(img::validate(m), Contains("data_files is 0"));
    m.data_files = img::max_data_files + 1;
    CHECK_THROWS_WITH(img::validate(m), Contains("data_files is 257"));
  }
}

TEST_CASE("the writer refuses a manifest whose data files disagree with what was written") {
  scratch s;
  img::manifest m = skeleton();
  m.pools[0].allocations.push_back({base0, MiB, vmmckpt::alloc_api::cuda_malloc});
  img::writer w(s.dir / "img", 2);
  const auto data = bytes_for(base0, MiB);
  w.begin_extent(1, base0, MiB);
  w.write(1, data.data(), MiB);
  const auto e = w.end_extent(1);
  CHECK(e.file == 1);
  CHECK(e.offset == 0);
  m.pools[0].extents = {e};
  m.data_bytes = MiB;
  m.data_files = 1;  // validate() refuses the file index first
  CHECK_THROWS_WITH(w.commit(m), Contains("data files"));
  m.data_files = 2;
  w.commit(m);
  CHECK_THROWS_WITH(img::writer(s.dir / "other", 0), Contains("expected 1 to 256"));
  CHECK_THROWS_WITH(w.begin_extent(2, base0, 1), Contains("already committed"));
}

TEST_CASE("a format 1 image (one data file, no file fields) still reads and verifies") {
  scratch s;
  const fs::path dir = s.dir / "v1";
  fs::create_directory(dir);
  const auto data = bytes_for(base0, 4096);
  img::streaming_checksum sum;
  sum.update(data.data(), data.size());
  img::manifest m = skeleton();
  m.format = 1;
  m.pools[0].allocations.push_back({base0, 4096, vmmckpt::alloc_api::cuda_malloc});
  m.pools[0].extents.push_back({base0, 4096, 4096, 0, 0, sum.value(), {}});
  m.data_bytes = 4096;
  const std::string text = img::to_json(m) + "\n";
  CHECK(text.find("\"file\"") == std::string::npos);
  CHECK(text.find("data_files") == std::string::npos);
  std::ofstream(dir / "manifest.json", std::ios::binary) << text;
  // A format 1 data file: magic, version 1, payload size, manifest XXH3 (left 0: verify must say so), zeros.
  std::vector<unsigned char> header(64, 0);
  std::memcpy(header.data(), "VMMCKPTDATA", 12);
  header[12] = 1;
  for (int i = 0; i < 8; ++i) header[16 + i] = static_cast<unsigned char>(std::uint64_t{4096} >> (8 * i));
  std::ofstream out(dir / "data.bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 64);
  out.write(reinterpret_cast<const char*>(data.data()), 4096);
  out.close();
  const auto r = img::reader::open(dir);
  CHECK(r.info().format == 1);
  CHECK(r.info().data_files == 1);
  std::vector<unsigned char> got(4096);
  r.read(r.info().pools[0].extents[0], got.data());
  CHECK(got == data);
  CHECK_THROWS_WITH(r.verify_data(), Contains("the manifest was changed"));
}
