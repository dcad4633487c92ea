// Internals shared by the image writer, reader and manifest code: data-file header, hashing, errors.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/little_endian.hpp"

namespace vmmckpt::image::detail {

inline constexpr std::string_view manifest_name = "manifest.json";
inline constexpr std::string_view tables_name = "tables.bin";  // format 3: the allocation and extent tables
inline constexpr std::string_view data_name = "data.bin";      // data file 0; file k > 0 is "data.k.bin"
std::string data_file_name(std::uint32_t file);

// Data file header: magic (12 bytes, NUL included), u32 version, u64 payload size, u64 manifest
// XXH3, then (version 2) u32 file index and u32 file count, zeros to 64.
inline constexpr std::size_t data_header_size = 64;
inline constexpr std::array<char, 12> data_magic = {'V', 'M', 'M', 'C', 'K', 'P', 'T', 'D', 'A', 'T', 'A', '\0'};
inline constexpr std::uint32_t data_version = format_version;  // the data files' version follows the manifest's

// A manifest larger than this is refused before parsing: it bounds the memory a hostile file can
// make the reader spend (a million allocations take about 100 MB of JSON).
inline constexpr std::uint64_t max_manifest_bytes = 512ULL << 20;
// JSON nesting deeper than this is refused while parsing; the manifest itself needs 4 levels.
inline constexpr std::size_t max_json_depth = 16;

// tables.bin (format 3): a 64-byte header (magic, u32 version, u64 allocation records, u64 extent
// records, u64 pools, zeros), then each pool's allocation records followed by its extent records.
inline constexpr std::size_t tables_header_size = 64;
inline constexpr std::array<char, 12> tables_magic = {'V', 'M', 'M', 'C', 'K', 'P', 'T', 'T', 'A', 'B', 'L', 'E'};
// u64 addr, u64 size, u64 stored, u64 offset, u64 checksum, u32 file, u32 zero
inline constexpr std::size_t extent_record_size = 48;
// Format 5: after each pool's extent records, the blocks of its extents in order: u64 checksum, u32
// where (0: this image's data file, 1: the parent), u32 zero. The header's bytes 40..47 count them.
inline constexpr std::size_t block_record_size = 16;
// The block sizes a format 5 manifest may give: a block is at least a page, and at most what a
// reader buffers at once.
inline constexpr std::uint64_t min_block_size = 4096;
inline constexpr std::uint64_t max_block_size = 1ULL << 30;

// The tables of m's pools, as tables.bin holds them.
std::string encode_tables(const manifest& m);
// Fills every pool's allocations and extents from tables.bin's bytes; `allocation_counts` and
// `extent_counts` are the manifest's, pool by pool. Throws image_error naming what is wrong
// (sizes, header, a reserved byte, an API number), without the file name.
void decode_tables(const std::string& bytes, const std::vector<std::uint64_t>& allocation_counts,
                   const std::vector<std::uint64_t>& extent_counts, manifest& m);

// The manifest file of a format 3 image: everything but the tables, which it counts and checksums.
std::string encode_manifest_file(const manifest& m, std::uint64_t tables_bytes, std::uint64_t tables_checksum);
struct manifest_file {
  manifest m;                 // format 3: pools without their allocations and extents, which tables.bin holds
  bool tables_apart = false;  // format 3
  std::vector<std::uint64_t> allocation_counts, extent_counts;  // format 3, pool by pool
  std::uint64_t tables_bytes = 0, tables_checksum = 0;          // format 3
};
// Decodes manifest.json as an image holds it (strictly, as from_json): formats 1 and 2 with their
// tables inline, format 3 with them counted and checksummed, apart in tables.bin.
manifest_file decode_manifest_file(const std::string& text);

using header_bytes = std::array<unsigned char, data_header_size>;
// Bytes 24..31 hold the XXH3-64 of manifest.json as written, so that verify
// catches a changed byte anywhere in the image, the manifest included.
header_bytes encode_data_header(std::uint64_t payload_bytes, std::uint64_t manifest_checksum = 0,
                                std::uint32_t file = 0, std::uint32_t files = 1);
std::uint64_t header_manifest_checksum(const header_bytes& h);
// Returns an empty string when the header is right for file `file` of `files` of an image of
// manifest format `format`, otherwise what is wrong with it.
std::string check_data_header(const header_bytes& h, std::uint64_t expected_payload,
                              std::uint32_t format = data_version, std::uint32_t file = 0, std::uint32_t files = 1);

// XXH3_64bits_update with the CPU's widest vector unit (AVX2 where present): the same result.
void checksum_update(XXH3_state_t* state, const void* data, std::size_t size);
// Whether `size` bytes are all zero (the writers' test for a zero block); stops at the first byte that is not.
bool all_zero(const void* data, std::size_t size);

// Hashes on a helper thread while the caller does I/O: one thread cannot both copy into the page
// cache and hash at full speed, two overlap them. Hashes one range at a time, in call order.
class background_hasher {
 public:
  background_hasher();
  ~background_hasher();
  background_hasher(const background_hasher&) = delete;
  background_hasher& operator=(const background_hasher&) = delete;
  // Starts hashing [p, p + n) into *state; waits for the previous range first.
  void start(XXH3_state_t* state, const void* p, std::size_t n);
  void wait();  // until the last range is hashed; [p, p + n) may be reused after this

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  XXH3_state_t* state_ = nullptr;
  const void* p_ = nullptr;
  std::size_t n_ = 0;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

// Waits for a background_hasher when leaving a scope, exceptions included: the caller's memory
// must not be released while the helper still reads it.
struct hash_waiter {
  // A constructor, not an aggregate: std::optional::emplace needs one with clang before 16.
  explicit hash_waiter(background_hasher& hasher) : h(hasher) {}
  background_hasher& h;
  ~hash_waiter() { h.wait(); }
};

// By reference: std::runtime_error copies the message whatever it is given.
[[noreturn]] inline void fail(const std::string& message) { throw image_error(message); }

inline std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  return ::strerror_r(err, buf, sizeof buf);
}

inline std::string extent_name(std::size_t pool, std::size_t index) {  // "pools[0].extents[3]"
  return "pools[" + std::to_string(pool) + "].extents[" + std::to_string(index) + "]";
}

}  // namespace vmmckpt::image::detail
