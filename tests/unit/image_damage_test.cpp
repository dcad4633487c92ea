// Every bit flip and truncation of an image is refused by open + verify_data, naming a defect.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "vmmckpt/image/image.hpp"

namespace fs = std::filesystem;
using namespace vmmckpt::image;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    char pattern[] = "/tmp/vmmckpt-damage-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    path = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A small image: one pool, three allocations with their bytes.
fs::path make_image(const fs::path& where) {
  const fs::path dir = where / "image";
  writer w(dir);
  manifest m;
  m.tool_version = "test";
  m.created = "2026-11-22T00:00:00Z";
  m.host = "host";
  m.pid = 42;
  m.command = {"prog", "--flag"};
  m.devices = {{0, "dev", "GPU-00000000-0000-0000-0000-000000000000", 9, 0}};
  pool p;
  p.device = 0;
  p.base = 0x200000000000ULL;
  p.size = 1ULL << 30;
  p.granularity = 2ULL << 20;
  const std::uint64_t sizes[] = {1000, 4096, 3000};
  std::uint64_t addr = p.base;
  for (std::uint64_t size : sizes) {
    std::vector<unsigned char> bytes(size);
    for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>(i * 13 + size);
    p.allocations.push_back({addr, size, vmmckpt::alloc_api::cuda_malloc});
    w.begin_extent(addr, size);
    w.write(bytes.data(), size);
    p.extents.push_back(w.end_extent());
    addr += 8192;
  }
  m.pools.push_back(p);
  m.data_bytes = 1000 + 4096 + 3000;
  w.commit(m);
  return dir;
}

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The defect named, or empty when the image passes.
std::string check(const fs::path& dir) {
  try {
    reader::open(dir).verify_data();
    return {};
  } catch (const image_error& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("a flipped bit anywhere in the manifest, the tables or the data is refused", "[image][damage]") {
  temp_dir tmp;
  const fs::path dir = make_image(tmp.path);
  REQUIRE(check(dir).empty());
  int tried = 0;
  for (const char* name : {"manifest.json", "tables.bin", "data.bin"}) {
    const fs::path file = dir / name;
    const auto original = read_all(file);
    for (std::size_t i = 0; i < original.size(); ++i) {
      for (int bit : {0, 5}) {
        auto damaged = original;
        damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
        write_all(file, damaged);
        const std::string why = check(dir);
        INFO(name << " byte " << i << " bit " << bit);
        REQUIRE_FALSE(why.empty());
        ++tried;
      }
    }
    write_all(file, original);
  }
  REQUIRE(check(dir).empty());
  WARN("bit flips tried: " << tried << ", all refused");
}

TEST_CASE("a truncated or extended manifest, tables or data file is refused", "[image][damage]") {
  temp_dir tmp;
  const fs::path dir = make_image(tmp.path);
  int tried = 0;
  for (const char* name : {"manifest.json", "tables.bin", "data.bin"}) {
    const fs::path file = dir / name;
    const auto original = read_all(file);
    for (std::size_t keep = 0; keep < original.size(); keep += (name[0] == 'm' ? 1 : 7)) {
      write_all(file, std::vector<char>(original.begin(), original.begin() + static_cast<long>(keep)));
      INFO(name << " cut to " << keep << " bytes");
      REQUIRE_FALSE(check(dir).empty());
      ++tried;
    }
    auto longer = original;
    longer.push_back('\n');
    longer.push_back('x');
    write_all(file, longer);
    REQUIRE_FALSE(check(dir).empty());
    ++tried;
    write_all(file, original);
  }
  REQUIRE(check(dir).empty());
  WARN("truncations and extensions tried: " << tried << ", all refused");
}
