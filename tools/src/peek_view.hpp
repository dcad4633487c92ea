// What `cuda-ckpt peek` shows of bytes read from a live program's GPU memory: element types, shapes, a hex dump,
// values as rows, a summary and a .npy file. Pure formatting over bytes already read: no CUDA, no I/O of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace vmmckpt::tools::peek_view {

// The element types `-t` takes. fp8e4m3 is the OCP "FN" variant (no Inf, S.1111.111 is NaN, max 448), the one
// CUDA's __nv_fp8_e4m3 is; fp8e5m2 has Inf and NaN as IEEE formats do.
enum class element { f16, bf16, f32, f64, i8, u8, i32, i64, fp8e4m3, fp8e5m2 };

// The names `-t` takes, as listed: "f16", "bf16", "f32", "f64", "i8", "u8", "i32", "i64", "fp8e4m3", "fp8e5m2".
std::optional<element> parse_element(std::string_view name);
std::string_view name_of(element e);
std::string element_names();          // "f16, bf16, ..." for help and error text
std::size_t element_size(element e);  // bytes

// The element at p (element_size(e) bytes, little-endian) as a double. Every f16, bf16, fp8 and f32 value is exact
// in a double; i64 values beyond 2^53 are rounded (write_values prints integers exactly).
double value_at(element e, const unsigned char* p);

// "--shape 4,1024" (also "4x1024"): every dimension a decimal number > 0. Throws std::invalid_argument naming the
// bad text.
std::vector<std::uint64_t> parse_shape(std::string_view text);
// Whether `shape` of `e` is exactly `bytes` (shape empty: whether bytes is a whole number of elements). Throws
// std::invalid_argument saying both sides in elements and bytes.
void check_shape(const std::vector<std::uint64_t>& shape, element e, std::uint64_t bytes);

// count is every element; nan, pos_inf and neg_inf count those; min, max and mean are over the finite values only,
// and NaN when there is none.
struct summary {
  std::uint64_t count = 0, nan = 0, pos_inf = 0, neg_inf = 0;
  double min = 0, max = 0, mean = 0;
};
// Throws std::invalid_argument when bytes.size() is not a multiple of element_size(e): a partial element at the end
// means the range or the type is wrong, and ignoring it would hide that.
summary summarize(element e, std::string_view bytes);

// xxd-style: "00007f0000001000: 4865 6c6c 6f20 776f 726c 6400 0000 0000  Hello world....." The address column is the
// GPU address (base + offset, 16 hex digits), 16 bytes a line, printable ASCII else '.'; a short last line is padded
// so that its ASCII column lines up with the others.
void write_hexdump(std::ostream& out, std::uint64_t base, std::string_view bytes);

// Values as rows: the last dimension of `shape` per line (shape empty: 8 per line), each line prefixed by the index
// of its first element, "[0,3,0]". Floats with 7 significant digits as %g has them ("nan", "inf", "-inf"), integers
// exactly. At most max_lines lines, then one line "... N more lines". Throws std::invalid_argument as check_shape.
void write_values(std::ostream& out, element e, const std::vector<std::uint64_t>& shape, std::string_view bytes,
                  std::size_t max_lines = 64);

// A .npy file (format 1.0) of the bytes: shape empty means 1-D of all elements. numpy has no bf16 or fp8 dtype:
// bf16 is written as '<u2' and fp8 as '|u1', the raw bit patterns (the caller says so). Throws as check_shape.
std::string npy_file(element e, const std::vector<std::uint64_t>& shape, std::string_view bytes);

// The summary as a JSON object: {"count":..,"nan":..,"pos_inf":..,"neg_inf":..,"min":..,"max":..,"mean":..}, null
// for a NaN min, max or mean (JSON has no NaN), numbers in the shortest text that reads back as the same double.
std::string summary_json(const summary& s);

}  // namespace vmmckpt::tools::peek_view
