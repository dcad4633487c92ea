// Unit tests of the checkpoint image: round trip, atomic commit, file modes, every validation rule, corruption.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "skip.hpp"
#include "image_test_support.hpp"
#include "vmmckpt/image/image.hpp"

namespace fs = std::filesystem;
namespace img = vmmckpt::image;
using Catch::Matchers::Contains;

namespace {

using vmmckpt::test::pattern;
using vmmckpt::test::scratch;

constexpr std::uint64_t KiB = 1ULL << 10;
constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t GiB = 1ULL << 30;
constexpr std::uint64_t base0 = 0x200000000000ULL;
constexpr std::uint64_t base1 = base0 + 512 * GiB;

// A fresh directory under /tmp, removed with everything in it at the end of the test.

struct planned_extent {
  std::uint64_t addr;
  std::vector<std::size_t> chunks;  // how the caller feeds it
};

struct sample {
  img::manifest m;
  std::map<std::uint64_t, std::vector<unsigned char>> bytes;  // by address
};

img::manifest base_manifest() {
  img::manifest m;
  m.tool_version = "0.1.0-test";
  m.created = "2026-11-22T10:00:00Z";
  m.host = "node-7";
  m.pid = 4242;
  m.command = {"./app", "--steps", "100"};
  m.devices = {{0, "NVIDIA H200", "GPU-11111111-2222-3333-4444-555555555555", 9, 0},
               {1, "NVIDIA H200", "GPU-66666666-7777-8888-9999-000000000000", 9, 0}};
  m.hold_us = 1234;
  return m;
}

// Writes an image with the given pools (allocations filled in, extents planned) and returns what it wrote.
sample write_image(const fs::path& final_dir, std::vector<img::pool> pools,
                   const std::vector<std::vector<planned_extent>>& plan) {
  sample s;
  s.m = base_manifest();
  img::writer w(final_dir);
  std::uint64_t seed = 1;
  for (std::size_t p = 0; p < pools.size(); ++p) {
    for (const auto& pe : plan[p]) {
      std::uint64_t size = 0;
      for (auto c : pe.chunks) size += c;
      auto data = pattern(size, seed++);
      w.begin_extent(pe.addr, size);
      std::size_t at = 0;
      for (auto c : pe.chunks) {
        w.write(data.data() + at, c);
        at += c;
      }
      img::extent e = w.end_extent();
      CHECK(e.addr == pe.addr);
      CHECK(e.size == size);
      CHECK(e.offset == s.m.data_bytes);
      pools[p].extents.push_back(e);
      s.m.data_bytes += size;
      s.bytes[pe.addr] = std::move(data);
    }
  }
  s.m.pools = std::move(pools);
  CHECK_FALSE(fs::exists(final_dir));
  w.commit(s.m);
  s.m.image_id = w.image_id();
  return s;
}

img::pool make_pool(int device, std::uint64_t base, std::uint64_t size, std::vector<img::allocation> allocs) {
  img::pool p;
  p.device = device;
  p.base = base;
  p.size = size;
  p.granularity = 2 * MiB;
  p.allocations = std::move(allocs);
  return p;
}

// Several pools and extents; the 20 MiB extent is fed in chunks that fill the writer's buffer,
// overflow it, and bypass it (9 MiB). Pools 512 GiB apart, as a process's pools lie.
sample big_image(const fs::path& dir) {
  std::vector<img::pool> pools = {
      make_pool(0, base0, 512 * GiB,
                {{base0, 4 * MiB, vmmckpt::alloc_api::cuda_malloc},
                 {base0 + 4 * MiB, 100, vmmckpt::alloc_api::cuda_malloc},
                 {base0 + 8 * MiB, 20 * MiB, vmmckpt::alloc_api::cu_mem_alloc}}),
      make_pool(1, base1, 512 * GiB, {{base1 + 256, 4096, vmmckpt::alloc_api::cuda_malloc_async}}),
  };
  std::vector<std::vector<planned_extent>> plan = {
      {{base0, {MiB, MiB, MiB, MiB}},
       {base0 + 4 * MiB, {100}},
       {base0 + 8 * MiB, {3 * MiB, 9 * MiB, 5 * MiB, 3 * MiB}}},
      {{base1 + 256, {4096}}},
  };
  return write_image(dir, pools, plan);
}

// A few KB: what the validation tests start from and then spoil.
//   pools[0]: allocations a0 [b, 4K), a1 [b+8K, +1000), a2 [b+2M, +6K);
//             extents e0 = a0, e1 = a1, e2 and e3 together a2.   pools[1]: one allocation, one extent.
sample small_image(const fs::path& dir) {
  std::vector<img::pool> pools = {
      make_pool(0, base0, 512 * GiB,
                {{base0, 4 * KiB, vmmckpt::alloc_api::cuda_malloc},
                 {base0 + 8 * KiB, 1000, vmmckpt::alloc_api::cuda_malloc},
                 {base0 + 2 * MiB, 6 * KiB, vmmckpt::alloc_api::cuda_malloc}}),
      make_pool(1, base1, 512 * GiB, {{base1 + 512, 300, vmmckpt::alloc_api::cu_mem_alloc}}),
  };
  std::vector<std::vector<planned_extent>> plan = {
      {{base0, {4096}}, {base0 + 8 * KiB, {1000}}, {base0 + 2 * MiB, {4096}}, {base0 + 2 * MiB + 4 * KiB, {2048}}},
      {{base1 + 512, {300}}},
  };
  return write_image(dir, pools, plan);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

std::string open_error(const fs::path& dir) {
  try {
    img::reader::open(dir);
  } catch (const img::image_error& e) {
    return e.what();
  }
  FAIL("reader::open accepted " << dir);
  return {};
}

// A copy of the small image whose manifest is replaced by `text` (and its tables by `tables`).
fs::path image_with_manifest_text(const scratch& s, const std::string& text, const std::string* tables = nullptr) {
  const fs::path good = s / "good";
  if (!fs::exists(good)) small_image(good);
  const fs::path bad = s / "bad";
  fs::remove_all(bad);
  fs::create_directory(bad);
  fs::copy_file(good / "data.bin", bad / "data.bin");
  if (tables != nullptr)
    write_file(bad / "tables.bin", *tables);
  else
    fs::copy_file(good / "tables.bin", bad / "tables.bin");
  write_file(bad / "manifest.json", text);
  return bad;
}

// The reader's first complaint about the small image after `spoil` changed its manifest.
std::string refusal(const std::function<void(img::manifest&)>& spoil) {
  scratch s;
  sample good = small_image(s / "good");
  img::manifest m = good.m;
  spoil(m);
  // validate() is the same rule set, applied to the struct.
  CHECK_THROWS_AS(img::validate(m), img::image_error);
  const img::metadata_files files = img::encode_metadata(m);
  return open_error(image_with_manifest_text(s, files.manifest_json, &files.tables));
}

// The same, for a change made on the JSON text of the manifest file (types, missing fields, ...).
std::string json_refusal(const std::function<void(nlohmann::json&)>& spoil) {
  scratch s;
  small_image(s / "good");
  auto j = nlohmann::json::parse(read_file(s / "good" / "manifest.json"));
  spoil(j);
  return open_error(image_with_manifest_text(s, j.dump(2)));
}

// The same, for a format 2 manifest, whose tables are in its JSON (the reader still reads format 2).
std::string format2_json_refusal(const std::function<void(nlohmann::json&)>& spoil) {
  scratch s;
  img::manifest m = small_image(s / "good").m;
  m.format = 2;
  auto j = nlohmann::json::parse(img::to_json(m));
  spoil(j);
  return open_error(image_with_manifest_text(s, j.dump(2)));
}

// Opens data.bin of an image for in-place damage.
void patch(const fs::path& file, std::uint64_t offset, const std::string& bytes) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

bool has_partial(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".partial-") != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("image: round trip of several pools and extents", "[image]") {
  scratch s;
  const sample w = big_image(s / "img");
  const auto r = img::reader::open(s / "img");
  CHECK(r.info() == w.m);
  r.verify_data();
  for (const auto& p : r.info().pools)
    for (const auto& e : p.extents) {
      std::vector<unsigned char> got(e.size);
      r.read(e, got.data());
      CHECK(got == w.bytes.at(e.addr));
    }
  CHECK(r.info().data_bytes == 4 * MiB + 100 + 20 * MiB + 4096);
  CHECK(fs::file_size(s / "img" / "data.bin") == 64 + r.info().data_bytes);
  CHECK_FALSE(has_partial(s.dir));
}

// The writer and the readers hash with the CPU's widest vector unit and in cache-sized pieces;
// the checksum must still be the XXH3-64 of the extent's bytes, computed here in one call with
// this file's own (portable) build of XXH3.
TEST_CASE("image: an extent's checksum is the XXH3-64 of its blocks' checksums however they are fed", "[image]") {
  scratch s;
  const auto data = pattern(9 * MiB + 3, 77);  // more than the writer buffers, not a piece multiple
  // docs/image-format.md, "Blocks": XXH3-64 of each MiB (the last shorter), then XXH3-64 of those
  // checksums as little-endian u64s.
  std::vector<unsigned char> sums;
  std::vector<std::uint64_t> block_sums;
  for (std::size_t at = 0; at < data.size(); at += MiB) {
    const std::uint64_t b = XXH3_64bits(data.data() + at, std::min<std::size_t>(MiB, data.size() - at));
    block_sums.push_back(b);
    for (int k = 0; k < 8; ++k) sums.push_back(static_cast<unsigned char>(b >> (8 * k)));
  }
  const std::uint64_t expected = XXH3_64bits(sums.data(), sums.size());
  img::writer w(s / "img");
  w.begin_extent(base0, data.size());
  w.write(data.data(), 5);                    // buffered
  w.write(data.data() + 5, data.size() - 5);  // big: hashed and written piece by piece
  const img::extent e = w.end_extent();
  CHECK(e.checksum == expected);
  REQUIRE(e.blocks.size() == 10);
  for (std::size_t b = 0; b < e.blocks.size(); ++b) {
    CHECK(e.blocks[b].checksum == block_sums[b]);
    CHECK(e.blocks[b].checksum ==
          img::block_checksum(data.data() + b * MiB, std::min<std::size_t>(MiB, data.size() - b * MiB)));
    CHECK_FALSE(e.blocks[b].in_parent);
  }
  CHECK(img::combined_checksum(e.blocks) == expected);
  for (const std::size_t split : {std::size_t{0}, std::size_t{1}, std::size_t{239}, std::size_t{MiB + 1}}) {
    img::streaming_checksum sum(img::write_block_size);
    sum.update(data.data(), split);
    sum.update(data.data() + split, data.size() - split);
    CHECK(sum.value() == expected);
  }
  img::manifest m = base_manifest();
  m.devices.resize(1);
  img::pool p;
  p.base = base0;
  p.size = 512 * GiB;
  p.granularity = 2 * MiB;
  p.allocations.push_back({base0, data.size(), vmmckpt::alloc_api::cuda_malloc});
  p.extents.push_back(e);
  m.pools.push_back(p);
  m.data_bytes = data.size();
  w.commit(m);
  const auto r = img::reader::open(s / "img");
  r.verify_data();
  std::vector<unsigned char> got(data.size());
  r.read(r.info().pools[0].extents[0], got.data());
  CHECK(got == data);
}

TEST_CASE("image: JSON round trip and byte-identical re-encoding", "[image]") {
  scratch s;
  const sample w = big_image(s / "img");
  CHECK(img::from_json(img::to_json(w.m)) == w.m);
  CHECK(img::from_json(img::to_json(w.m, -1)) == w.m);
  // The files are exactly what encode_metadata gives for the manifest read back.
  const std::string file = read_file(s / "img" / "manifest.json");
  const img::metadata_files again = img::encode_metadata(img::reader::open(s / "img").info());
  CHECK(again.manifest_json == file);
  CHECK(again.tables == read_file(s / "img" / "tables.bin"));
  std::size_t blocks = 0;
  for (const auto& p : w.m.pools)
    for (const auto& e : p.extents) blocks += e.blocks.size();
  CHECK(blocks >= 4);
  CHECK(again.tables.size() == 64 + 4 * 24 + 4 * 48 + blocks * 16);  // 4 allocations, 4 extents, their blocks
  // Field order and representation are part of the format.
  CHECK(file.rfind("{\n  \"magic\": \"vmmckpt-image\",\n  \"format\": 6,\n  \"image_id\": \"", 0) == 0);
  CHECK_THAT(file, Contains("\"base\": \"0x200000000000\""));
  const auto j = nlohmann::json::parse(file);
  CHECK(j["tables"]["checksum"].get<std::string>().size() == 16);
  CHECK(j["pools"][0]["allocation_count"] == 3);
  CHECK(j["pools"][0]["extent_count"] == 3);
  CHECK(j["pools"][0]["size"].is_number_unsigned());
  CHECK_FALSE(j["pools"][0].contains("extents"));
}

TEST_CASE("image: a partial image lists what it lacks; a complete one has no such field", "[image]") {
  scratch s;
  sample w = small_image(s / "good");
  CHECK_FALSE(nlohmann::json::parse(read_file(s / "good" / "manifest.json")).contains("lacking"));
  CHECK(img::reader::open(s / "good").info().lacking.empty());
  // The same manifest, marked partial: it reads back with its list, in both JSON forms.
  img::manifest m = w.m;
  m.lacking = {{"managed", 64ULL << 20}, {"imported VMM", 2ULL << 20}};
  CHECK(img::from_json(img::to_json(m)) == m);
  const img::metadata_files files = img::encode_metadata(m);
  const auto j = nlohmann::json::parse(files.manifest_json);
  REQUIRE(j.contains("lacking"));
  CHECK(j["lacking"][0]["kind"] == "managed");
  CHECK(j["lacking"][1]["bytes"] == 2ULL << 20);
  const fs::path partial = image_with_manifest_text(s, files.manifest_json, &files.tables);
  CHECK(img::reader::open(partial).info().lacking == m.lacking);
}

TEST_CASE("image: one extent holds several allocations packed, and each reads back where it belongs", "[image]") {
  scratch s;
  // Three allocations with gaps between them, stored as one extent: only their bytes are in the file.
  img::pool p = make_pool(0, base0, 512 * GiB,
                          {{base0, 100, vmmckpt::alloc_api::cuda_malloc},
                           {base0 + 512, 300, vmmckpt::alloc_api::cuda_malloc},
                           {base0 + 4 * KiB, 2000, vmmckpt::alloc_api::cu_mem_alloc}});
  const auto stored = pattern(2400, 7);
  img::manifest m = base_manifest();
  {
    img::writer w(s / "img");
    w.begin_extent(0, base0, 4 * KiB + 2000, 2400);
    w.write(stored.data(), 1000);
    w.write(stored.data() + 1000, 1400);
    p.extents.push_back(w.end_extent());
    m.pools = {p};
    m.data_bytes = 2400;
    w.commit(m);
  }
  REQUIRE(fs::file_size(s / "img" / "data.bin") == 64 + 2400);
  const auto r = img::reader::open(s / "img");
  r.verify_data();
  const img::pool& got = r.info().pools[0];
  REQUIRE(got.extents.size() == 1);
  CHECK(got.extents[0].stored == 2400);
  const auto runs = img::stored_runs(got, got.extents[0]);
  REQUIRE(runs.size() == 3);
  CHECK((runs[1].addr == base0 + 512 && runs[1].size == 300 && runs[1].offset == 100));
  CHECK((runs[2].addr == base0 + 4 * KiB && runs[2].size == 2000 && runs[2].offset == 400));

  auto range = [&](std::uint64_t addr, std::uint64_t size) {
    std::vector<unsigned char> out;
    r.read_range(addr, size, [&](const unsigned char* b, std::size_t n) { out.insert(out.end(), b, b + n); });
    return out;
  };
  CHECK(range(base0 + 512, 300) == std::vector<unsigned char>(stored.begin() + 100, stored.begin() + 400));
  CHECK(range(base0 + 4 * KiB + 10, 20) == std::vector<unsigned char>(stored.begin() + 410, stored.begin() + 430));
  // A range into a gap is named, and nothing is handed out.
  bool handed = false;
  try {
    r.read_range(base0 + 50, 100, [&](const unsigned char*, std::size_t) { handed = true; });
    FAIL("a range into the gap was read");
  } catch (const img::image_error& e) {
    CHECK_THAT(e.what(), Contains("byte 0x200000000064 is not in the image"));
  }
  CHECK_FALSE(handed);
  // The same layout is not a format 2 image: there an extent lies inside one allocation.
  img::manifest old = r.info();
  old.format = 2;
  old.block_size = 0;
  for (auto& e : old.pools[0].extents) e.blocks.clear();
  old.image_id.clear();
  old.pools[0].extents[0].stored = old.pools[0].extents[0].size;
  old.data_bytes = old.pools[0].extents[0].size;
  CHECK_THROWS_WITH(img::validate(old), Contains("is not inside one allocation (format 2 extents are)"));
}

TEST_CASE("image: reader refuses tables that are not the manifest's", "[image][validation]") {
  scratch s;
  const sample good = small_image(s / "good");
  const img::metadata_files files = img::encode_metadata(good.m);
  auto with_tables = [&](std::string tables) {
    return open_error(image_with_manifest_text(s, files.manifest_json, &tables));
  };
  CHECK_THAT(with_tables(files.tables + "x"),
             Contains("tables.bin: " + std::to_string(files.tables.size() + 1) + " bytes, the manifest says " +
                      std::to_string(files.tables.size())));
  std::string flipped = files.tables;
  flipped[64 + 3] ^= 1;
  CHECK_THAT(with_tables(flipped), Contains("tables.bin: checksum mismatch"));
  fs::remove(image_with_manifest_text(s, files.manifest_json) / "tables.bin");
  CHECK_THAT(open_error(s / "bad"), Contains("tables.bin: missing"));
  // Damage that keeps the sizes: the checksums in the manifest are recomputed, so the tables' own
  // rules are what refuses them.
  auto refused = [&](std::size_t at, unsigned char value) {
    std::string tables = files.tables;
    tables[at] = static_cast<char>(value);
    img::manifest m = good.m;
    std::string text = files.manifest_json;
    const std::string old_sum = nlohmann::json::parse(text)["tables"]["checksum"];
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(tables.data(), tables.size())));
    text.replace(text.find(old_sum), old_sum.size(), sum);
    return open_error(image_with_manifest_text(s, text, &tables));
  };
  CHECK_THAT(refused(0, 'X'), Contains("tables.bin: bad magic"));
  CHECK_THAT(refused(16, 9), Contains("tables.bin: the header counts 9 allocations"));
  CHECK_THAT(refused(50, 1), Contains("tables.bin: reserved header byte 50 is not zero"));
  CHECK_THAT(refused(64 + 16, 42), Contains("tables.bin: pools[0].allocations[0].api 42 is not an allocation API"));
  CHECK_THAT(refused(64 + 20, 1), Contains("tables.bin: pools[0].allocations[0]: reserved bytes are not zero"));
  CHECK_THAT(refused(64 + 3 * 24 + 44, 1), Contains("tables.bin: pools[0].extents[0]: reserved bytes are not zero"));
}

TEST_CASE("image: nothing at the final path before commit; an abandoned writer leaves nothing", "[image]") {
  scratch s;
  const fs::path final_dir = s / "img";
  fs::path temp;
  {
    img::writer w(final_dir);
    temp = w.temporary_dir();
    CHECK(temp.parent_path() == s.dir);
    CHECK(temp.filename().string().rfind("img.partial-" + std::to_string(::getpid()) + "-", 0) == 0);
    CHECK(fs::is_directory(temp));
    w.begin_extent(base0, 16 * MiB);
    const auto data = pattern(16 * MiB, 3);
    w.write(data.data(), data.size());
    w.end_extent();
    CHECK_FALSE(fs::exists(final_dir));
    // An interrupted dump's directory is refused by name even once it holds files.
    CHECK_THAT(open_error(temp), Contains("unfinished image"));
  }
  CHECK_FALSE(fs::exists(temp));
  CHECK_FALSE(fs::exists(final_dir));
  CHECK(fs::is_empty(s.dir));
}

TEST_CASE("image: the writer refuses an existing final directory and an unusable parent", "[image]") {
  scratch s;
  fs::create_directory(s / "img");
  try {
    img::writer w(s / "img");
    FAIL("writer accepted an existing directory");
  } catch (const img::image_error& e) {
    CHECK_THAT(e.what(), Contains((s / "img").string()) && Contains("already exists"));
  }
  try {
    img::writer w(s / "missing" / "img");
    FAIL("writer accepted a missing parent");
  } catch (const img::image_error& e) {
    CHECK_THAT(e.what(), Contains((s / "missing").string()) && Contains("No such file or directory"));
  }
  CHECK_FALSE(has_partial(s.dir));
}

TEST_CASE("image: the writer refuses a parent it cannot write to", "[image]") {
  if (::geteuid() == 0)
    VMMCKPT_SKIP("running as root: an unwritable parent directory cannot be simulated with permissions");
  scratch s;
  fs::create_directory(s / "ro");
  fs::permissions(s / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  try {
    img::writer w(s / "ro" / "img");
    FAIL("writer accepted an unwritable parent");
  } catch (const img::image_error& e) {
    CHECK_THAT(e.what(), Contains((s / "ro").string()) && Contains("Permission denied"));
  }
  CHECK_FALSE(has_partial(s.dir));
}

TEST_CASE("image: a final directory that appears during the dump is not replaced", "[image]") {
  scratch s;
  img::writer w(s / "img");
  fs::create_directory(s / "img");  // empty: rename(2) alone would silently replace it
  img::manifest m = base_manifest();
  try {
    w.commit(m);
    FAIL("commit replaced a directory");
  } catch (const img::image_error& e) {
    CHECK_THAT(e.what(), Contains("already exists"));
  }
  CHECK(fs::is_empty(s / "img"));
}

TEST_CASE("image: files are 0600 and the directory 0700 whatever the umask", "[image]") {
  scratch s;
  const mode_t old = ::umask(0);
  small_image(s / "img");
  ::umask(old);
  struct stat st;
  REQUIRE(::stat((s / "img").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  REQUIRE(::stat((s / "img" / "manifest.json").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  REQUIRE(::stat((s / "img" / "data.bin").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
}

TEST_CASE("image: commit refuses a manifest that does not match what was written", "[image]") {
  scratch s;
  img::writer w(s / "img");
  w.begin_extent(base0, 100);
  const auto data = pattern(100, 1);
  w.write(data.data(), 100);
  const img::extent e = w.end_extent();
  img::manifest m = base_manifest();
  m.pools = {make_pool(0, base0, 64 * MiB, {{base0, 100, vmmckpt::alloc_api::cuda_malloc}})};
  m.data_bytes = 100;
  m.pools[0].extents = {e};
  m.pools[0].extents[0].checksum ^= 1;
  CHECK_THROWS_WITH(w.commit(m), Contains("commit refused") && Contains("pools[0].extents[0]"));
  m.pools[0].extents[0] = e;
  m.pools[0].allocations[0].size = 0;
  CHECK_THROWS_WITH(w.commit(m), Contains("commit refused") && Contains("pools[0].allocations[0] has size zero"));
  CHECK_FALSE(fs::exists(s / "img"));
  // A refused manifest leaves the writer usable.
  m.pools[0].allocations[0].size = 100;
  w.commit(m);
  m.image_id = w.image_id();
  CHECK(img::reader::open(s / "img").info() == m);
}

TEST_CASE("image: writer misuse is refused", "[image]") {
  scratch s;
  img::writer w(s / "img");
  const auto data = pattern(64, 1);
  CHECK_THROWS_WITH(w.write(data.data(), 1), Contains("no extent"));
  img::writer w2(s / "img2");
  w2.begin_extent(base0, 32);
  CHECK_THROWS_WITH(w2.write(data.data(), 64), Contains("overflow the extent"));
  img::writer w3(s / "img3");
  w3.begin_extent(base0, 64);
  w3.write(data.data(), 32);
  CHECK_THROWS_WITH(w3.end_extent(), Contains("got 32 of its 64 bytes"));
  img::writer w4(s / "img4");
  CHECK_THROWS_WITH(w4.begin_extent(base0, 0), Contains("empty"));
  CHECK_THROWS_WITH(img::writer(s / "x.partial-1"), Contains(".partial-"));
}

// ---- Validation: one case per rule, each naming the defect. ----

#define REFUSES(name, expected, body)                                        \
  TEST_CASE("image: reader refuses " name, "[image][validation]") {          \
    CHECK_THAT(refusal([](img::manifest& m) { body; }), Contains(expected)); \
  }
#define REFUSES_JSON(name, expected, body)                                         \
  TEST_CASE("image: reader refuses " name, "[image][validation]") {                \
    CHECK_THAT(json_refusal([](nlohmann::json& j) { body; }), Contains(expected)); \
  }
#define REFUSES_FORMAT2_JSON(name, expected, body)                                         \
  TEST_CASE("image: reader refuses in format 2 " name, "[image][validation]") {            \
    CHECK_THAT(format2_json_refusal([](nlohmann::json& j) { body; }), Contains(expected)); \
  }

TEST_CASE("image: the unspoilt small image is accepted", "[image][validation]") {
  scratch s;
  const sample w = small_image(s / "img");
  img::validate(w.m);
  img::reader::open(s / "img").verify_data();
}

TEST_CASE("image: reader refuses a missing manifest", "[image][validation]") {
  scratch s;
  small_image(s / "img");
  fs::remove(s / "img" / "manifest.json");
  CHECK_THAT(open_error(s / "img"), Contains("manifest.json: missing"));
  CHECK_THAT(open_error(s / "nothing"), Contains("cannot open the image directory"));
}

TEST_CASE("image: reader refuses a manifest that is not JSON", "[image][validation]") {
  scratch s;
  CHECK_THAT(open_error(image_with_manifest_text(s, "{\"magic\": ")), Contains("manifest.json: not valid JSON"));
  CHECK_THAT(open_error(image_with_manifest_text(s, "")), Contains("manifest.json: not valid JSON"));
}

TEST_CASE("image: reader refuses deeply nested JSON", "[image][validation]") {
  scratch s;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THAT(open_error(image_with_manifest_text(s, deep)), Contains("nested deeper"));
}

TEST_CASE("image: reader refuses a manifest that is not an object", "[image][validation]") {
  scratch s;
  CHECK_THAT(open_error(image_with_manifest_text(s, "[1, 2]")), Contains("manifest.json: not a JSON object"));
}

REFUSES_JSON("a missing magic", "manifest.json: missing field 'magic'", j.erase("magic"))
REFUSES_JSON("a wrong magic", "manifest.json: magic is \"criu\"", j["magic"] = "criu")
REFUSES_JSON("a newer format", "manifest.json: format 7 is newer than this tool understands (6)", j["format"] = 7;
             j["pools"] = "whatever a future format holds")
REFUSES_JSON("an unknown older format", "manifest.json: format 0 is not a known format", j["format"] = 0)
REFUSES_JSON("a format that is not a number", "manifest.json: format: expected an integer", j["format"] = "1")
REFUSES_JSON("a missing top-level field", "manifest.json: missing field 'pools'", j.erase("pools"))
REFUSES_JSON("a missing nested field", "manifest.json: pools[1]: missing field 'extent_count'",
             j["pools"][1].erase("extent_count"))
REFUSES_FORMAT2_JSON("a missing nested field", "manifest.json: pools[1].extents[0]: missing field 'checksum'",
                     j["pools"][1]["extents"][0].erase("checksum"))
REFUSES_JSON("a string where a number belongs", "manifest.json: pid: expected a 64-bit signed integer",
             j["pid"] = "4242")
REFUSES_FORMAT2_JSON("a negative size", "manifest.json: pools[0].extents[2].size: expected a non-negative integer",
                     j["pools"][0]["extents"][2]["size"] = -512)
REFUSES_JSON("a negative count", "manifest.json: pools[0].allocation_count: expected a non-negative integer",
             j["pools"][0]["allocation_count"] = -1)
REFUSES_JSON("a fractional size", "manifest.json: pools[0].size: expected a non-negative integer",
             j["pools"][0]["size"] = 1.5)
REFUSES_JSON("a size beyond 2^64", "manifest.json: data_bytes: expected a non-negative integer", j["data_bytes"] = 1e30)
REFUSES_JSON("an address that is not hex", "manifest.json: pools[0].base: expected an address",
             j["pools"][0]["base"] = "0x20000000000g")
REFUSES_FORMAT2_JSON("an address as a number", "manifest.json: pools[0].allocations[1].addr: expected an address",
                     j["pools"][0]["allocations"][1]["addr"] = 35184372097024ULL)
REFUSES_JSON("an address of more than 64 bits", "manifest.json: pools[0].base: expected an address",
             j["pools"][0]["base"] = "0x10000000000000000")
REFUSES_FORMAT2_JSON("a short checksum", "manifest.json: pools[0].extents[1].checksum: expected a checksum",
                     j["pools"][0]["extents"][1]["checksum"] = "0123456789abcde")
REFUSES_JSON("a short tables checksum", "manifest.json: tables.checksum: expected a checksum",
             j["tables"]["checksum"] = "0123456789abcde")
REFUSES_JSON("a missing image id", "manifest.json: missing field 'image_id'", j.erase("image_id"))
REFUSES_JSON("an image id that is not 32 hex digits", "manifest.json: image_id \"xyz\" is not 32 lowercase hex digits",
             j["image_id"] = "xyz")
// What a refusal quotes of the manifest is printable ASCII, whatever bytes the manifest held.
REFUSES_JSON("an image id beyond ASCII, quoting it printably", "manifest.json: image_id \"\\xc3\\xa9xyz\" is not",
             j["image_id"] = "\xc3\xa9xyz")
REFUSES_FORMAT2_JSON("an unknown allocation API, quoting it printably",
                     "manifest.json: pools[0].allocations[0].api \"cuMem\\xc3\\x83lloc\\x01\" is not an allocation API",
                     j["pools"][0]["allocations"][0]["api"] = "cuMem\xc3\x83lloc\x01")
REFUSES_JSON("an ordinal beyond int", "manifest.json: devices[0].ordinal: expected a 32-bit integer",
             j["devices"][0]["ordinal"] = 1ULL << 40)
REFUSES_JSON("a pool that is not an object", "manifest.json: pools[1]: expected an object", j["pools"][1] = 7)
REFUSES_JSON("a command that is not an array", "manifest.json: command: expected an array", j["command"] = "./app")

REFUSES("a lack without a kind", "manifest.json: lacking[1].kind is empty",
        (m.lacking = {{"managed", 4096}, {"", 4096}}))
REFUSES("a lack of zero bytes", "manifest.json: lacking[0].bytes is zero", (m.lacking = {{"arrays", 0}}))
REFUSES_JSON("a lacking that is not an array", "manifest.json: lacking: expected an array", j["lacking"] = "managed")
REFUSES_JSON("a lack of negative bytes", "manifest.json: lacking[0].bytes: expected a non-negative integer",
             j["lacking"] = nlohmann::json::parse(R"([{"kind": "managed", "bytes": -1}])"))
REFUSES_JSON("a lack without bytes", "manifest.json: lacking[0]: missing field 'bytes'",
             j["lacking"] = nlohmann::json::parse(R"([{"kind": "managed"}])"))

REFUSES("a pid of zero", "manifest.json: pid 0 is not a valid process id", m.pid = 0)
REFUSES("a pid beyond pid_t", "manifest.json: pid 4294967296 is not a valid process id", m.pid = 1LL << 32)
REFUSES("a negative device ordinal", "manifest.json: devices[0].ordinal -1 is out of range", m.devices[0].ordinal = -1)
REFUSES("a repeated device ordinal", "manifest.json: devices[1].ordinal 0 repeats devices[0]", m.devices[1].ordinal = 0)
REFUSES("a negative compute capability", "manifest.json: devices[1]: negative compute capability",
        m.devices[1].cc_minor = -2)
REFUSES("a pool on an unlisted device", "manifest.json: pools[1].device 7 is not listed in devices",
        m.pools[1].device = 7)
REFUSES("two pools on one device", "manifest.json: pools[1].device 0 already has pools[0]", m.pools[1].device = 0)
REFUSES("a zero pool base", "manifest.json: pools[0].base is zero", m.pools[0].base = 0)
REFUSES("a zero pool size", "manifest.json: pools[1].size is zero", m.pools[1].size = 0)
REFUSES("a zero granularity", "manifest.json: pools[0].granularity is zero", m.pools[0].granularity = 0)
REFUSES("a base off the granularity",
        "manifest.json: pools[0].base 0x200000001000 is not a multiple of the granularity", m.pools[0].base += 4096)
REFUSES("a size off the granularity", "manifest.json: pools[1].size 549755817984 is not a multiple of the granularity",
        m.pools[1].size += 4096)
REFUSES("a pool past the end of the address space",
        "manifest.json: pools[1]: base 0xffffffffffe00000 + size 549755813888 overflows",
        m.pools[1].base = 0xffffffffffe00000ULL)
REFUSES("overlapping pools", "manifest.json: pools[1] overlaps pools[0]", m.pools[1].base = base0 + 32 * MiB)
REFUSES("an empty allocation", "manifest.json: pools[0].allocations[1] has size zero",
        m.pools[0].allocations[1].size = 0)
REFUSES("an allocation outside its pool",
        "manifest.json: pools[1].allocations[0] (0x1fffffe00000+300) is outside the pool",
        m.pools[1].allocations[0].addr = base0 - 2 * MiB)
REFUSES("an allocation running past its pool",
        "manifest.json: pools[0].allocations[2] (0x200000200000+18446744073709551615) is outside",
        m.pools[0].allocations[2].size = ~0ULL)
REFUSES("unsorted allocations", "manifest.json: pools[0].allocations[1] at 0x200000000000 is out of order",
        std::swap(m.pools[0].allocations[0], m.pools[0].allocations[1]))
REFUSES("overlapping allocations", "manifest.json: pools[0].allocations[1] overlaps allocations[0]",
        m.pools[0].allocations[0].size = 8 * KiB + 1)
REFUSES("an empty extent", "manifest.json: pools[0].extents[1] is empty", m.pools[0].extents[1].size = 0)
REFUSES("an extent outside its pool", "manifest.json: pools[1].extents[0] (0x100+300) is outside the pool",
        m.pools[1].extents[0].addr = 0x100)
REFUSES("an extent running past the end of the address space",
        "manifest.json: pools[0].extents[3] (0x200000201000+18446744073709551615) is outside",
        m.pools[0].extents[3].size = ~0ULL)
REFUSES("unsorted extents", "manifest.json: pools[0].extents[3] at 0x200000000000 is out of order (below extents[2]",
        m.pools[0].extents[3].addr = base0)
REFUSES("overlapping extents", "manifest.json: pools[0].extents[3] overlaps extents[2]",
        m.pools[0].extents[3].addr = m.pools[0].extents[2].addr + 100)
REFUSES("an extent outside every allocation",
        "manifest.json: pools[0].extents[1] (0x200000001000+1000) does not begin inside an allocation",
        m.pools[0].extents[1].addr = base0 + 4 * KiB)
REFUSES("an extent before the first allocation",
        "manifest.json: pools[1].extents[0] (0x208000000200+300) does not begin inside an allocation",
        m.pools[1].allocations[0].addr += 2 * MiB)
REFUSES("an extent crossing an allocation's end",
        "manifest.json: pools[0].extents[1] (0x200000002000+1000) does not end inside an allocation",
        m.pools[0].allocations[1].size = 999)
REFUSES("an extent that stores other than its allocations' bytes",
        "manifest.json: pools[0].extents[1].stored is 999 but the allocations in its range hold 1000 bytes",
        m.pools[0].extents[1].stored = 999)
REFUSES("an extent offset out of sequence", "manifest.json: pools[0].extents[2].offset is 5095, expected 5096",
        m.pools[0].extents[2].offset -= 1)
REFUSES("an extent offset out of sequence across pools",
        "manifest.json: pools[1].extents[0].offset is 0, expected 11240", m.pools[1].extents[0].offset = 0)
REFUSES("data_bytes other than the extents' sum",
        "manifest.json: data_bytes is 11541 but the extents store 11540 bytes", m.data_bytes += 1)
REFUSES("a huge data_bytes", "manifest.json: data_bytes is 18446744073709551615 but the extents store",
        m.data_bytes = ~0ULL)

// What a restore relies on (docs/image-format.md, rule 7).
REFUSES("a pool in kernel space", "manifest.json: the pools' layout (base 0xffff800000000000", m.pools.resize(1);
        m.pools[0].base = 0xffff800000000000ULL; for (auto& a
                                                      : m.pools[0].allocations) a.addr += 0xffff800000000000ULL - base0;
        for (auto& e
             : m.pools[0].extents) e.addr += 0xffff800000000000ULL - base0;
        m.data_bytes = 11240)
REFUSES("a device the shim does not serve", "manifest.json: pools[1].device 1000 is beyond the devices vmmckpt serves",
        m.devices[1].ordinal = 1000;
        m.pools[1].device = 1000)
REFUSES("pools that follow no one layout",
        "manifest.json: pools[1].base 0x208000200000 is not where pools[0]'s layout puts its device",
        m.pools[1].base += 2 * MiB;
        m.pools[1].allocations[0].addr += 2 * MiB; m.pools[1].extents[0].addr += 2 * MiB)
REFUSES("pools of different sizes", "manifest.json: pools[1].size 549753716736 differs from pools[0]'s",
        m.pools[1].size -= 2 * MiB)
REFUSES("an allocation not wholly in the image",
        "manifest.json: pools[0].allocations[2] (0x200000200000+420000000000) is not wholly in the image",
        m.pools[0].allocations[2].size = 420000000000ULL)
REFUSES("an allocation with a hole in its extents",
        "manifest.json: pools[0].allocations[2] (0x200000200000+6144) is not wholly in the image: its bytes from "
        "0x200000201000",
        m.pools[0].extents.erase(m.pools[0].extents.begin() + 3);
        m.pools[1].extents[0].offset -= 2048; m.data_bytes -= 2048)

// ---- The data file. ----

TEST_CASE("image: reader refuses a missing data file", "[image][data]") {
  scratch s;
  small_image(s / "img");
  fs::remove(s / "img" / "data.bin");
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: missing"));
}

TEST_CASE("image: reader refuses a damaged data header", "[image][data]") {
  scratch s;
  const auto fresh = [&] {
    fs::remove_all(s / "img");
    small_image(s / "img");
    return s / "img" / "data.bin";
  };
  patch(fresh(), 0, "X");
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: bad magic"));
  patch(fresh(), 12, std::string("\x07\0\0\0", 4));
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: format 7 is newer than this tool understands (6)"));
  patch(fresh(), 12, std::string("\x01\0\0\0", 4));
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: format 1 does not match the manifest's format 6"));
  patch(fresh(), 16, std::string("\x01\0\0\0", 4));
  CHECK_THAT(
      open_error(s / "img"),
      Contains("data.bin: header gives a payload of 1 bytes but the manifest's extents in this file hold 11540"));
  patch(fresh(), 32, "\x01");
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: header says it is data file 1 of 1, expected 0 of 1"));
  patch(fresh(), 40, "\x01");
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: reserved header byte 40 is not zero"));
}

TEST_CASE("image: reader refuses a truncated or extended data file", "[image][data]") {
  scratch s;
  small_image(s / "img");
  const fs::path data = s / "img" / "data.bin";
  fs::resize_file(data, 64 + 11540 - 1);
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: truncated: 11603 bytes, expected 11604"));
  fs::resize_file(data, 64 + 11540 + 1);
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: 11605 bytes, expected 11604") && Contains("after the payload"));
  fs::resize_file(data, 10);
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: truncated: 10 bytes, shorter than its 64-byte header"));
}

TEST_CASE("image: reader refuses symlinked manifest and data files", "[image][data]") {
  scratch s;
  small_image(s / "img");
  fs::rename(s / "img" / "manifest.json", s / "manifest.json");
  fs::create_symlink(s / "manifest.json", s / "img" / "manifest.json");
  CHECK_THAT(open_error(s / "img"), Contains("manifest.json: is a symbolic link (refused)"));
  fs::remove(s / "img" / "manifest.json");
  fs::rename(s / "manifest.json", s / "img" / "manifest.json");
  fs::rename(s / "img" / "data.bin", s / "data.bin");
  fs::create_symlink(s / "data.bin", s / "img" / "data.bin");
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: is a symbolic link (refused)"));
}

TEST_CASE("image: reader refuses members that are not regular files", "[image][data]") {
  scratch s;
  small_image(s / "img");
  fs::remove(s / "img" / "data.bin");
  REQUIRE(::mkfifo((s / "img" / "data.bin").c_str(), 0600) == 0);  // must not block
  CHECK_THAT(open_error(s / "img"), Contains("data.bin: not a regular file"));
}

TEST_CASE("image: a flipped bit is named by read and verify_data", "[image][data]") {
  scratch s;
  const sample w = small_image(s / "img");
  // extents[1] of pool 0 starts at payload offset 4096.
  const fs::path data = s / "img" / "data.bin";
  std::string byte = read_file(data).substr(64 + 4096 + 17, 1);
  byte[0] = static_cast<char>(byte[0] ^ 0x08);
  patch(data, 64 + 4096 + 17, byte);
  const auto r = img::reader::open(s / "img");  // open checks structure only
  const std::string expected = "data.bin: pools[0].extents[1] at 0x200000002000: checksum mismatch";
  CHECK_THROWS_WITH(r.verify_data(), Contains(expected));
  std::vector<unsigned char> buf(1000);
  CHECK_THROWS_WITH(r.read(r.info().pools[0].extents[1], buf.data()), Contains(expected));
  buf.resize(4096);
  r.read(r.info().pools[0].extents[0], buf.data());  // the others still read
  CHECK(buf == w.bytes.at(base0));
  img::extent stranger = r.info().pools[0].extents[0];
  stranger.addr += 1;
  CHECK_THROWS_WITH(r.read(stranger, buf.data()), Contains("not an extent of this image"));
}

TEST_CASE("image: a flipped bit deep in a big extent is found (hashing on the helper thread)", "[image][data]") {
  scratch s;
  big_image(s / "img");
  const auto r = img::reader::open(s / "img");
  const img::extent big = r.info().pools[0].extents[2];
  REQUIRE(big.size == 20 * MiB);
  patch(s / "img" / "data.bin", 64 + big.offset + 17 * MiB + 5, "\x5a");  // in the third 8 MiB piece
  const std::string expected = "data.bin: pools[0].extents[2] at 0x200000800000: checksum mismatch";
  CHECK_THROWS_WITH(r.verify_data(), Contains(expected));
  std::vector<unsigned char> buf(big.size);
  CHECK_THROWS_WITH(r.read(big, buf.data()), Contains(expected));
}

TEST_CASE("image: a write failure names the file and leaves no image", "[image]") {
  scratch s;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{1 * MiB, 1 * MiB};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    std::string report = "no error";
    try {
      img::writer w(s / "img");
      const auto data = pattern(MiB, 5);
      w.begin_extent(base0, 16 * MiB);
      for (int i = 0; i < 16; ++i) w.write(data.data(), data.size());
      w.end_extent();
      w.commit(base_manifest());
    } catch (const img::image_error& e) {
      report = std::string("image_error: ") + e.what();
    } catch (const std::exception& e) {
      report = std::string("other: ") + e.what();
    }
    (void)!::write(fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK_THAT(report, Contains("image_error: ") && Contains("data.bin: write failed: File too large") &&
                         Contains((s / "img.partial-").string()));
  CHECK_FALSE(fs::exists(s / "img"));
  CHECK_FALSE(has_partial(s.dir));
}
