// Internals shared by the image writer, reader and JSON code: data-file header, validation, errors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "vmmckpt/image.hpp"

namespace vmmckpt::image::detail {

inline constexpr std::string_view manifest_name = "manifest.json";
inline constexpr std::string_view data_name = "data.bin";

// data.bin header: magic (12 bytes, NUL included), u32 version, u64 payload size, zeros to 64.
inline constexpr std::size_t data_header_size = 64;
inline constexpr std::array<char, 12> data_magic = {'V', 'M', 'M', 'C', 'K', 'P', 'T', 'D', 'A', 'T', 'A', '\0'};
inline constexpr std::uint32_t data_version = 1;

// A manifest larger than this is refused before parsing: it bounds the memory a hostile file can
// make the reader spend (a million allocations take about 100 MB of JSON).
inline constexpr std::uint64_t max_manifest_bytes = 512ULL << 20;
// JSON nesting deeper than this is refused while parsing; the manifest itself needs 4 levels.
inline constexpr std::size_t max_json_depth = 16;

using header_bytes = std::array<unsigned char, data_header_size>;
header_bytes encode_data_header(std::uint64_t payload_bytes);
// Returns an empty string when the header is right, otherwise what is wrong with it.
std::string check_data_header(const header_bytes& h, std::uint64_t expected_payload);

[[noreturn]] void fail(std::string message);
std::string errno_text(int err);
std::string hex(std::uint64_t v);  // "0x2000"
std::string extent_name(std::size_t pool, std::size_t index);  // "pools[0].extents[3]"

}  // namespace vmmckpt::image::detail
