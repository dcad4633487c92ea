// The formatting of `cuda-ckpt peek` (peek_view.hpp): decoding elements, shapes, hex dump, rows, summary, .npy.
#include "peek_view.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace vmmckpt::tools::peek_view {

namespace {

struct element_info {
  element e;
  std::string_view name;
  std::size_t size;
  std::string_view npy_descr;  // numpy's dtype; the raw bits for bf16 and fp8, which numpy lacks
};

constexpr std::array<element_info, 10> elements = {{
    {element::f16, "f16", 2, "<f2"},
    {element::bf16, "bf16", 2, "<u2"},
    {element::f32, "f32", 4, "<f4"},
    {element::f64, "f64", 8, "<f8"},
    {element::i8, "i8", 1, "|i1"},
    {element::u8, "u8", 1, "|u1"},
    {element::i32, "i32", 4, "<i4"},
    {element::i64, "i64", 8, "<i8"},
    {element::fp8e4m3, "fp8e4m3", 1, "|u1"},
    {element::fp8e5m2, "fp8e5m2", 1, "|u1"},
}};

const element_info& info(element e) {
  for (const auto& i : elements)
    if (i.e == e) return i;
  throw std::invalid_argument("unknown element type");
}

// Little-endian whatever the host is: the bytes are the GPU's, and GPUs are little-endian.
std::uint64_t load_le(const unsigned char* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// A small float format with an IEEE-like layout: `mant_bits` of fraction, an exponent of `exp_bits` with bias
// 2^(exp_bits-1)-1, subnormals at exponent 0. `ieee_top`: the top exponent is Inf (fraction 0) and NaN; otherwise
// (e4m3 FN) it holds ordinary values and only the all-ones pattern is NaN.
double decode_small_float(std::uint32_t bits, int exp_bits, int mant_bits, bool ieee_top) {
  const std::uint32_t mant = bits & ((1u << mant_bits) - 1);
  const std::uint32_t exp = (bits >> mant_bits) & ((1u << exp_bits) - 1);
  const bool negative = (bits >> (mant_bits + exp_bits)) & 1;
  const std::uint32_t exp_max = (1u << exp_bits) - 1;
  const int bias = (1 << (exp_bits - 1)) - 1;
  double v;
  if (ieee_top && exp == exp_max) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!ieee_top && exp == exp_max && mant == (1u << mant_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(static_cast<double>(mant | (1u << mant_bits)), static_cast<int>(exp) - bias - mant_bits);
  }
  return negative ? -v : v;
}

std::int64_t sign_extend(std::uint64_t v, std::size_t bytes) {
  const unsigned shift = 64 - 8 * static_cast<unsigned>(bytes);
  return static_cast<std::int64_t>(v << shift) >> shift;
}

bool is_integer(element e) { return e == element::i8 || e == element::u8 || e == element::i32 || e == element::i64; }

// The element count of `shape`; `overflow` says whether it, or its bytes, would not fit in 64 bits.
std::uint64_t checked_product(const std::vector<std::uint64_t>& shape, std::uint64_t size, bool& overflow) {
  std::uint64_t n = 1;
  overflow = false;
  for (const std::uint64_t d : shape) overflow |= __builtin_mul_overflow(n, d, &n);
  std::uint64_t bytes = 0;
  overflow |= __builtin_mul_overflow(n, size, &bytes);
  return n;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s;
  for (const std::uint64_t d : shape) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s;
}

// The element count of `bytes` under `shape` (shape empty: all of them), after check_shape.
std::uint64_t element_count(const std::vector<std::uint64_t>& shape, element e, std::uint64_t bytes) {
  check_shape(shape, e, bytes);
  return bytes / element_size(e);
}

}  // namespace

std::optional<element> parse_element(std::string_view name) {
  for (const auto& i : elements)
    if (i.name == name) return i.e;
  return std::nullopt;
}

std::string_view name_of(element e) { return info(e).name; }

std::string element_names() {
  std::string s;
  for (const auto& i : elements) (s += s.empty() ? "" : ", ") += i.name;
  return s;
}

std::size_t element_size(element e) { return info(e).size; }

double value_at(element e, const unsigned char* p) {
  switch (e) {
    case element::f16: return decode_small_float(static_cast<std::uint32_t>(load_le(p, 2)), 5, 10, true);
    case element::fp8e4m3: return decode_small_float(p[0], 4, 3, false);
    case element::fp8e5m2: return decode_small_float(p[0], 5, 2, true);
    case element::bf16: {
      // bf16 is the top half of an f32.
      const auto bits = static_cast<std::uint32_t>(load_le(p, 2)) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    case element::f32: {
      const auto bits = static_cast<std::uint32_t>(load_le(p, 4));
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    case element::f64: {
      const std::uint64_t bits = load_le(p, 8);
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return d;
    }
    case element::u8: return p[0];
    case element::i8:
    case element::i32:
    case element::i64: return static_cast<double>(sign_extend(load_le(p, element_size(e)), element_size(e)));
  }
  throw std::invalid_argument("unknown element type");
}

std::vector<std::uint64_t> parse_shape(std::string_view text) {
  const std::string whole(text);
  auto bad = [&](std::string_view part) {
    return std::invalid_argument("--shape '" + whole + "': '" + std::string(part) +
                                 "' is not a dimension (dimensions are numbers > 0 separated by ',' or 'x', "
                                 "as in 4,1024 or 4x1024)");
  };
  std::vector<std::uint64_t> shape;
  while (true) {
    const std::size_t end = text.find_first_of(",x");
    std::string_view part = text.substr(0, end);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    std::uint64_t d = 0;
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), d);
    if (part.empty() || ec != std::errc{} || ptr != part.data() + part.size() || d == 0) throw bad(part);
    shape.push_back(d);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return shape;
}

void check_shape(const std::vector<std::uint64_t>& shape, element e, std::uint64_t bytes) {
  const std::size_t size = element_size(e);
  const std::string type(name_of(e));
  if (shape.empty()) {
    if (bytes % size != 0)
      throw std::invalid_argument(std::to_string(bytes) + " bytes are not a whole number of " + type + " elements (" +
                                  std::to_string(size) + " bytes each)");
    return;
  }
  for (const std::uint64_t d : shape)
    if (d == 0) throw std::invalid_argument("shape " + shape_text(shape) + " has a dimension of 0");
  bool overflow = false;
  const std::uint64_t n = checked_product(shape, size, overflow);
  if (overflow) throw std::invalid_argument("shape " + shape_text(shape) + " is too large");
  if (n * size != bytes) {
    const std::string read =
        bytes % size == 0 ? std::to_string(bytes / size) + " elements" : "not a whole number of elements";
    throw std::invalid_argument("shape " + shape_text(shape) + " is " + std::to_string(n) + " " + type + " elements (" +
                                std::to_string(n * size) + " bytes), but the range is " + std::to_string(bytes) +
                                " bytes (" + read + ")");
  }
}

summary summarize(element e, std::string_view bytes) {
  const std::size_t size = element_size(e);
  check_shape({}, e, bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  summary s;
  s.count = bytes.size() / size;
  std::uint64_t finite = 0;
  double sum = 0, compensation = 0;  // Neumaier's sum: the mean of many f32 values without drift
  for (std::uint64_t i = 0; i < s.count; ++i) {
    const double v = value_at(e, p + i * size);
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++(v > 0 ? s.pos_inf : s.neg_inf);
    } else {
      s.min = finite == 0 ? v : std::min(s.min, v);
      s.max = finite == 0 ? v : std::max(s.max, v);
      const double t = sum + v;
      compensation += std::abs(sum) >= std::abs(v) ? (sum - t) + v : (v - t) + sum;
      sum = t;
      ++finite;
    }
  }
  if (finite == 0) {
    s.min = s.max = s.mean = std::numeric_limits<double>::quiet_NaN();
  } else if (std::isfinite(sum)) {
    s.mean = (sum + compensation) / static_cast<double>(finite);
  } else {
    // Large f64 values overflow the sum: a running mean cannot, since it stays between min and max.
    double mean = 0;
    std::uint64_t k = 0;
    for (std::uint64_t i = 0; i < s.count; ++i) {
      const double v = value_at(e, p + i * size);
      if (!std::isfinite(v)) continue;
      ++k;
      mean += v / static_cast<double>(k) - mean / static_cast<double>(k);
    }
    s.mean = mean;
  }
  return s;
}

void write_hexdump(std::ostream& out, std::uint64_t base, std::string_view bytes) {
  constexpr std::size_t per_line = 16;
  constexpr std::size_t hex_width = per_line * 2 + per_line / 2 - 1;  // "4865 6c6c ... 0000"
  static constexpr char digits[] = "0123456789abcdef";
  for (std::size_t offset = 0; offset < bytes.size(); offset += per_line) {
    const std::string_view line = bytes.substr(offset, per_line);
    char address[20];
    std::snprintf(address, sizeof address, "%016llx", static_cast<unsigned long long>(base) + offset);
    std::string hex, ascii;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const auto c = static_cast<unsigned char>(line[i]);
      if (i > 0 && i % 2 == 0) hex += ' ';
      hex += digits[c >> 4];
      hex += digits[c & 0xf];
      ascii += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '.';
    }
    hex.resize(hex_width, ' ');
    out << address << ": " << hex << "  " << ascii << '\n';
  }
}

namespace {

std::string value_text(element e, const unsigned char* p) {
  if (is_integer(e)) {
    const std::size_t size = element_size(e);
    const std::uint64_t bits = load_le(p, size);
    return e == element::u8 ? std::to_string(bits) : std::to_string(sign_extend(bits, size));
  }
  const double v = value_at(e, p);
  if (std::isnan(v)) return "nan";  // whatever its sign bit: printf would say "-nan" for some
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.7g", v);
  return text;
}

// "[i,j,0]": the index of element `first` (a row's first) in `shape`; shape empty, the flat index.
std::string index_text(const std::vector<std::uint64_t>& shape, std::uint64_t first) {
  if (shape.empty()) return "[" + std::to_string(first) + "]";
  std::vector<std::uint64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = first % shape[d];
    first /= shape[d];
  }
  return "[" + shape_text(index) + "]";
}

}  // namespace

void write_values(std::ostream& out, element e, const std::vector<std::uint64_t>& shape, std::string_view bytes,
                  std::size_t max_lines) {
  const std::uint64_t count = element_count(shape, e, bytes.size());
  if (count == 0) return;
  const std::size_t size = element_size(e);
  const std::uint64_t row = shape.empty() ? 8 : shape.back();
  const std::uint64_t lines = (count + row - 1) / row;
  // The last row's index is the widest: every index is padded to it, so that the values start in one column.
  const std::size_t index_width = index_text(shape, (lines - 1) * row).size();
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (std::uint64_t line = 0; line < lines && line < max_lines; ++line) {
    std::string index = index_text(shape, line * row);
    index.resize(index_width, ' ');
    out << index;
    for (std::uint64_t i = line * row; i < count && i < (line + 1) * row; ++i)
      out << ' ' << value_text(e, p + i * size);
    out << '\n';
  }
  if (lines > max_lines) {
    const std::uint64_t more = lines - max_lines;
    out << "... " << more << (more == 1 ? " more line\n" : " more lines\n");
  }
}

std::string npy_file(element e, const std::vector<std::uint64_t>& shape, std::string_view bytes) {
  const std::uint64_t count = element_count(shape, e, bytes.size());
  std::string dims;
  if (shape.empty()) {
    dims = std::to_string(count) + ",";
  } else {
    for (const std::uint64_t d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    if (shape.size() == 1) dims += ",";  // a Python tuple of one
  }
  std::string header =
      "{'descr': '" + std::string(info(e).npy_descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6), version (2) and the header's length (2), then the header: padded with spaces and ended by '\n' so
  // that the data starts at a multiple of 64 bytes, as the format asks.
  constexpr std::size_t preamble = 10;
  const std::size_t total = (preamble + header.size() + 1 + 63) / 64 * 64;
  header.resize(total - preamble - 1, ' ');
  header += '\n';
  if (header.size() > 0xffff) throw std::invalid_argument("shape " + shape_text(shape) + " is too long for .npy");
  std::string file = "\x93NUMPY";
  file += '\x01';
  file += '\x00';
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  file += header;
  file += bytes;
  return file;
}

std::string summary_json(const summary& s) {
  auto number = [](double v) -> std::string {
    if (!std::isfinite(v)) return "null";
    char text[32];
    const auto [end, ec] = std::to_chars(text, text + sizeof text, v);  // the shortest text that reads back as v
    return ec == std::errc{} ? std::string(text, end) : "null";
  };
  return "{\"count\":" + std::to_string(s.count) + ",\"nan\":" + std::to_string(s.nan) +
         ",\"pos_inf\":" + std::to_string(s.pos_inf) + ",\"neg_inf\":" + std::to_string(s.neg_inf) +
         ",\"min\":" + number(s.min) + ",\"max\":" + number(s.max) + ",\"mean\":" + number(s.mean) + "}";
}

}  // namespace vmmckpt::tools::peek_view
