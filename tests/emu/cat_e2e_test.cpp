// End-to-end tests of cuda-ckpt cat (an image's bytes for an address range, checked) and of busy_pattern_check, which the GPU checks pipe it into.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "e2e_support.hpp"

using namespace vmmckpt::test;

namespace {

const std::string pattern_check = programs + "busy_pattern_check";
// Two and a half chunks: with --chunk 1M each buffer is three extents, spread over the data files.
constexpr std::uint64_t buffer_size = (5u << 20) / 2;
// A busy writer's image whose buffers span several extents and data files, and what the reader says of it.
struct busy_image {
  scratch_dir dir;
  fs::path image = dir.path / "image";
  std::vector<vmmckpt::image::allocation> buffers;
  std::vector<vmmckpt::image::extent> extents;  // every extent, by address
  vmmckpt::image::pool pool;                    // the pool that holds them (the test program has one)

  busy_image() {
    {
      background_process writer({cuda_ckpt, "run", "--", writer_program, "--size", std::to_string(buffer_size)});
      REQUIRE(writer.wait_for_output("ready\n"));
      const auto dumped = run_process(
          {cuda_ckpt, "dump", std::to_string(writer.pid()), "-o", image.string(), "--chunk", "1M", "--writers", "3"},
          {}, 120);
      INFO(describe(dumped));
      REQUIRE(dumped.exit_code == 0);
    }
    const auto reader = vmmckpt::image::reader::open(image);
    REQUIRE(reader.info().pools.size() == 1);
    pool = reader.info().pools[0];
    for (const auto& a : pool.allocations)
      if (a.size == buffer_size) buffers.push_back(a);
    extents = pool.extents;
    REQUIRE(buffers.size() == writer_buffers);
    REQUIRE(extents_of(buffers[0]).size() == 3);
  }

  std::vector<vmmckpt::image::extent> extents_of(const vmmckpt::image::allocation& a) const {
    std::vector<vmmckpt::image::extent> out;
    for (const auto& e : extents)
      if (e.addr < a.addr + a.size && a.addr < e.addr + e.size) out.push_back(e);
    return out;
  }

  // The bytes of [addr, addr + size) (inside allocations) as the image library reads its extents
  // (each checked) and places their stored bytes.
  std::string bytes(std::uint64_t addr, std::uint64_t size) const {
    const auto reader = vmmckpt::image::reader::open(image);
    std::string out(size, '\0');
    for (const auto& e : extents) {
      if (e.addr >= addr + size || addr >= e.addr + e.size) continue;
      std::string stored(e.stored, '\0');
      reader.read(e, stored.data());
      for (const auto& r : vmmckpt::image::stored_runs(pool, e)) {
        const std::uint64_t from = std::max(addr, r.addr), to = std::min(addr + size, r.addr + r.size);
        if (from < to) out.replace(from - addr, to - from, stored, r.offset + (from - r.addr), to - from);
      }
    }
    return out;
  }

  process_result cat(std::uint64_t addr, std::uint64_t size, std::vector<std::string> extra = {}) const {
    std::vector<std::string> argv{cuda_ckpt, "cat", image.string(), hex(addr), std::to_string(size)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_process(argv);
  }

  // Changes one payload byte of extent `e` in its data file: only that extent's checksum can catch it.
  void damage(const vmmckpt::image::extent& e) const {
    const std::string data = e.file == 0 ? "data.bin" : "data." + std::to_string(e.file) + ".bin";
    flip_byte(image / data, 64 + e.offset + e.stored / 2);
  }
};

bool nothing_named_like(const fs::path& p) {
  for (const auto& entry : fs::directory_iterator(p.parent_path()))
    if (entry.path().filename().string().rfind(p.filename().string(), 0) == 0) return false;
  return true;
}

}  // namespace

TEST_CASE("cat: a range's bytes are the image's, across extents and data files", "[emu][cat]") {
  busy_image img;
  const auto& a = img.buffers[0];

  const auto whole = img.cat(a.addr, a.size);
  INFO(whole.err);
  REQUIRE(whole.exit_code == 0);
  REQUIRE(whole.out.size() == a.size);
  REQUIRE(whole.out == img.bytes(a.addr, a.size));

  // Across the boundary between two extents, which lie in different places of the data files.
  const std::uint64_t boundary = img.extents_of(a)[1].addr;
  const auto across = img.cat(boundary - 100, 200);
  REQUIRE(across.exit_code == 0);
  REQUIRE(across.out == img.bytes(boundary - 100, 200));
  // A decimal address and a size with a unit name the same bytes.
  const auto decimal = run_process({cuda_ckpt, "cat", img.image.string(), std::to_string(a.addr), "1K"});
  REQUIRE(decimal.exit_code == 0);
  REQUIRE(decimal.out == img.bytes(a.addr, 1024));

  // -o: the bytes in a new owner-only file, nothing on stdout.
  const fs::path file = img.dir.path / "bytes";
  const auto to_file = img.cat(a.addr, a.size, {"-o", file.string()});
  INFO(to_file.err);
  REQUIRE(to_file.exit_code == 0);
  REQUIRE(to_file.out.empty());
  REQUIRE(file_text(file) == whole.out);
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  REQUIRE((st.st_mode & 0777) == 0600);
  REQUIRE(std::distance(fs::directory_iterator(img.dir.path), fs::directory_iterator()) == 2);  // image, bytes
}

TEST_CASE("cat: a byte in no extent fails naming it, and nothing is written", "[emu][cat]") {
  busy_image img;
  const auto& a = img.buffers[0];
  // The test needs a hole after the buffer (the allocator leaves one: blocks start on 2 MiB).
  const std::uint64_t end = a.addr + a.size;
  for (const auto& e : img.extents) REQUIRE_FALSE((e.addr <= end && end < e.addr + e.size));

  const fs::path file = img.dir.path / "bytes";
  SECTION("a range that runs past the buffer into the hole") {
    const auto r = img.cat(end - 16, 32);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.empty());
    REQUIRE(r.err.find("byte " + hex(end) + " is not in the image") != std::string::npos);
    REQUIRE(img.cat(end - 16, 32, {"-o", file.string()}).exit_code == 1);
  }
  SECTION("a range below the pool") {
    const auto r = img.cat(a.addr - 4096, 8);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.out.empty());
    REQUIRE(r.err.find("byte " + hex(a.addr - 4096) + " is not in the image") != std::string::npos);
  }
  REQUIRE(nothing_named_like(file));
}

TEST_CASE("cat: a damaged extent fails with its checksum and none of its bytes is written", "[emu][cat]") {
  busy_image img;
  const auto& a = img.buffers[0];
  const auto parts = img.extents_of(a);
  // The buffer's bytes in its first extent (which may begin in the allocation before it).
  const std::string good_first = img.bytes(a.addr, parts[0].addr + parts[0].size - a.addr);
  img.damage(parts[1]);

  // Only the damaged extent: nothing out.
  const auto inside = img.cat(parts[1].addr, 100);
  REQUIRE(inside.exit_code == 1);
  REQUIRE(inside.out.empty());
  REQUIRE(inside.err.find("checksum mismatch") != std::string::npos);
  // From a good extent into the damaged one: the good extent's bytes, checked, and not one more.
  const auto across = img.cat(a.addr, a.size);
  REQUIRE(across.exit_code == 1);
  REQUIRE(across.err.find("checksum mismatch") != std::string::npos);
  REQUIRE(across.out == good_first);
  // With -o, no file at all.
  const fs::path file = img.dir.path / "bytes";
  REQUIRE(img.cat(a.addr, a.size, {"-o", file.string()}).exit_code == 1);
  REQUIRE(nothing_named_like(file));
  // The other extents still read.
  REQUIRE(img.cat(img.buffers[1].addr, img.buffers[1].size).exit_code == 0);
}

TEST_CASE("cat: a bad command line exits 2 before the image is opened", "[emu][cat]") {
  for (const auto& args : std::vector<std::vector<std::string>>{{"0x1000"},
                                                                {"0x1000", "0"},
                                                                {"4K", "8"},
                                                                {"0x10zz", "8"},
                                                                {"0xffffffffffffffff", "2"},
                                                                {"0x1000", "8", "--bogus"}}) {
    std::vector<std::string> argv{cuda_ckpt, "cat", "/no/such/image"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = run_process(argv);
    INFO(describe(r));
    REQUIRE(r.exit_code == 2);
  }
}

TEST_CASE("busy_pattern_check passes a whole buffer from cat and names a torn one", "[emu][cat]") {
  busy_image img;
  const auto& a = img.buffers[0];
  const std::string pipe = "'" + cuda_ckpt + "' cat '" + img.image.string() + "' " + hex(a.addr) + " " +
                           std::to_string(a.size) + " | '" + pattern_check + "' buffer";
  const auto whole = run_process({"sh", "-c", pipe});
  INFO(describe(whole));
  REQUIRE(whole.exit_code == 0);
  REQUIRE(whole.out.rfind("buffer: whole, generation ", 0) == 0);

  // The same bytes with one word of the next generation in the middle.
  std::string bytes = img.bytes(a.addr, a.size);
  std::vector<std::uint64_t> words(bytes.size() / 8);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  words[1000] = vmmckpt::contracts::busy_word(words[0] + 1, 0, 1000, words.size());
  std::memcpy(bytes.data(), words.data(), bytes.size());
  const fs::path torn = img.dir.path / "torn";
  std::ofstream(torn, std::ios::binary) << bytes;
  const auto r = run_process({"sh", "-c", "'" + pattern_check + "' buffer < '" + torn.string() + "'"});
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.out.find("buffer: torn at word 1000") != std::string::npos);

  std::ofstream(torn, std::ios::binary | std::ios::trunc) << "seven b";
  REQUIRE(run_process({"sh", "-c", "'" + pattern_check + "' < '" + torn.string() + "'"}).exit_code == 2);
}
