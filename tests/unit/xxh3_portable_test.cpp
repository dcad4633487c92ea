// The portable XXH3-64 that a GPU kernel compiles (vmmckpt/xxh3_portable.hpp) gives xxhash.h's values: every length to
// 2100 bytes (each of XXH3's paths and their edges) and blocks of image format 5's size.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "vmmckpt/image/image.hpp"
#include "vmmckpt/image/xxh3_portable.hpp"

TEST_CASE("xxh3 portable: the same checksums as xxhash.h and image::block_checksum", "[image][blocks]") {
  std::mt19937_64 rng(5);
  std::vector<unsigned char> data(vmmckpt::image::write_block_size + 4099);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (std::size_t len = 0; len <= 2100; ++len) {
    INFO("length " << len);
    REQUIRE(vmmckpt::xxh3::hash64(data.data() + 3, len) == XXH3_64bits(data.data() + 3, len));
  }
  for (const std::size_t len :
       {std::size_t{4096}, std::size_t{65536} + 1, std::size_t{vmmckpt::image::write_block_size}, data.size()}) {
    INFO("length " << len);
    CHECK(vmmckpt::xxh3::hash64(data.data(), len) == XXH3_64bits(data.data(), len));
    CHECK(vmmckpt::xxh3::hash64(data.data(), len) == vmmckpt::image::block_checksum(data.data(), len));
  }
}
