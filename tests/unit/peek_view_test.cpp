// Unit tests of what `cuda-ckpt peek` shows (tools/src/peek_view.hpp): element decoding from known bit patterns,
// shapes and their errors, the hex dump's exact text, rows of values, the summary and its JSON, and .npy files.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "peek_view.hpp"

using namespace vmmckpt::tools::peek_view;
using Catch::Contains;

namespace {

// The bytes of `values`, each `size` bytes little-endian, as the GPU holds them.
std::string le_bytes(std::initializer_list<std::uint64_t> values, std::size_t size) {
  std::string out;
  for (const std::uint64_t v : values)
    for (std::size_t i = 0; i < size; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

double decode(element e, std::uint64_t bits) {
  const std::string b = le_bytes({bits}, element_size(e));
  return value_at(e, reinterpret_cast<const unsigned char*>(b.data()));
}

std::string f32_bytes(std::initializer_list<float> values) {
  std::string out;
  for (const float f : values) out.append(reinterpret_cast<const char*>(&f), sizeof f);  // the test host is LE
  return out;
}

std::string f64_bytes(std::initializer_list<double> values) {
  std::string out;
  for (const double d : values) out.append(reinterpret_cast<const char*>(&d), sizeof d);
  return out;
}

std::string values_text(element e, const std::vector<std::uint64_t>& shape, const std::string& bytes,
                        std::size_t max_lines = 64) {
  std::ostringstream out;
  write_values(out, e, shape, bytes, max_lines);
  return out.str();
}

constexpr double qnan = std::numeric_limits<double>::quiet_NaN();
constexpr double pinf = std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("peek: every element name parses back to its type, and unknown names do not", "[peek_view]") {
  CHECK(element_names() == "f16, bf16, f32, f64, i8, u8, i32, i64, fp8e4m3, fp8e5m2");
  for (const element e : {element::f16, element::bf16, element::f32, element::f64, element::i8, element::u8,
                          element::i32, element::i64, element::fp8e4m3, element::fp8e5m2}) {
    CHECK(parse_element(name_of(e)) == e);
  }
  CHECK_FALSE(parse_element("f8"));
  CHECK_FALSE(parse_element("F32"));
  CHECK_FALSE(parse_element(""));
  CHECK(element_size(element::f16) == 2);
  CHECK(element_size(element::bf16) == 2);
  CHECK(element_size(element::f32) == 4);
  CHECK(element_size(element::f64) == 8);
  CHECK(element_size(element::i8) == 1);
  CHECK(element_size(element::i64) == 8);
  CHECK(element_size(element::fp8e4m3) == 1);
  CHECK(element_size(element::fp8e5m2) == 1);
}

TEST_CASE("peek: f16 bit patterns decode to their values, subnormals, infinities and NaN included", "[peek_view]") {
  CHECK(decode(element::f16, 0x3c00) == 1.0);
  CHECK(decode(element::f16, 0xc000) == -2.0);
  CHECK(decode(element::f16, 0x3555) == 1365.0 / 4096);  // 0.333251953125, f16's nearest to 1/3
  CHECK(decode(element::f16, 0x7bff) == 65504.0);
  CHECK(decode(element::f16, 0x0400) == std::ldexp(1.0, -14));  // the smallest normal
  CHECK(decode(element::f16, 0x0001) == std::ldexp(1.0, -24));  // the smallest subnormal
  CHECK(decode(element::f16, 0x03ff) == std::ldexp(1023.0, -24));
  CHECK(decode(element::f16, 0x7c00) == pinf);
  CHECK(decode(element::f16, 0xfc00) == -pinf);
  CHECK(std::isnan(decode(element::f16, 0x7e00)));
  CHECK(std::isnan(decode(element::f16, 0x7c01)));
  CHECK(std::signbit(decode(element::f16, 0x8000)));
  CHECK(decode(element::f16, 0x8000) == 0.0);
}

#ifdef __FLT16_MAX__
TEST_CASE("peek: every f16 bit pattern decodes as the compiler's _Float16 has it", "[peek_view]") {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b16 = static_cast<std::uint16_t>(bits);
    _Float16 h;
    std::memcpy(&h, &b16, sizeof h);
    const double expected = static_cast<double>(h);
    const double got = decode(element::f16, bits);
    INFO("bits 0x" << std::hex << bits);
    if (std::isnan(expected)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(got == expected);
      CHECK(std::signbit(got) == std::signbit(expected));
    }
  }
}
#endif

TEST_CASE("peek: bf16 is the top half of an f32", "[peek_view]") {
  CHECK(decode(element::bf16, 0x3f80) == 1.0);
  CHECK(decode(element::bf16, 0xbf80) == -1.0);
  CHECK(decode(element::bf16, 0x4049) == 3.140625);
  CHECK(decode(element::bf16, 0x7f80) == pinf);
  CHECK(decode(element::bf16, 0xff80) == -pinf);
  CHECK(std::isnan(decode(element::bf16, 0x7fc0)));
  CHECK(decode(element::bf16, 0x0001) == std::ldexp(1.0, -133));  // subnormal
}

TEST_CASE("peek: fp8 e4m3 is the FN variant: no infinity, 448 at most, only S.1111.111 is NaN", "[peek_view]") {
  CHECK(decode(element::fp8e4m3, 0x38) == 1.0);
  CHECK(decode(element::fp8e4m3, 0xb8) == -1.0);
  CHECK(decode(element::fp8e4m3, 0x7e) == 448.0);
  CHECK(decode(element::fp8e4m3, 0xfe) == -448.0);
  CHECK(decode(element::fp8e4m3, 0x78) == 256.0);  // the top exponent holds ordinary values
  CHECK(std::isnan(decode(element::fp8e4m3, 0x7f)));
  CHECK(std::isnan(decode(element::fp8e4m3, 0xff)));
  CHECK(decode(element::fp8e4m3, 0x01) == std::ldexp(1.0, -9));  // the smallest subnormal
  CHECK(decode(element::fp8e4m3, 0x07) == std::ldexp(7.0, -9));
  CHECK(decode(element::fp8e4m3, 0x08) == std::ldexp(1.0, -6));  // the smallest normal
  // Positive patterns increase strictly up to 448, and the negative ones mirror them: no gap, no second NaN.
  for (std::uint32_t bits = 1; bits <= 0x7e; ++bits) {
    INFO("bits 0x" << std::hex << bits);
    CHECK(decode(element::fp8e4m3, bits) > decode(element::fp8e4m3, bits - 1));
    CHECK(decode(element::fp8e4m3, bits | 0x80) == -decode(element::fp8e4m3, bits));
  }
}

TEST_CASE("peek: fp8 e5m2 has infinities and NaN as IEEE formats do", "[peek_view]") {
  CHECK(decode(element::fp8e5m2, 0x3c) == 1.0);
  CHECK(decode(element::fp8e5m2, 0xc0) == -2.0);
  CHECK(decode(element::fp8e5m2, 0x7b) == 57344.0);
  CHECK(decode(element::fp8e5m2, 0x7c) == pinf);
  CHECK(decode(element::fp8e5m2, 0xfc) == -pinf);
  CHECK(std::isnan(decode(element::fp8e5m2, 0x7f)));
  CHECK(std::isnan(decode(element::fp8e5m2, 0x7d)));
  CHECK(decode(element::fp8e5m2, 0x01) == std::ldexp(1.0, -16));
  CHECK(decode(element::fp8e5m2, 0x04) == std::ldexp(1.0, -14));
}

TEST_CASE("peek: integers are little-endian, signed ones sign-extended", "[peek_view]") {
  CHECK(decode(element::i8, 0xff) == -1.0);
  CHECK(decode(element::i8, 0x80) == -128.0);
  CHECK(decode(element::u8, 0xff) == 255.0);
  CHECK(decode(element::i32, 0x04030201) == 67305985.0);
  CHECK(decode(element::i32, 0xfffffffe) == -2.0);
  CHECK(decode(element::i64, 0x8000000000000000) == -std::ldexp(1.0, 63));
  CHECK(decode(element::i64, 0x0000000100000000) == std::ldexp(1.0, 32));
  const std::string one = le_bytes({0x3f800000}, 4);
  CHECK(value_at(element::f32, reinterpret_cast<const unsigned char*>(one.data())) == 1.0);
  const std::string pi = f64_bytes({3.141592653589793});
  CHECK(value_at(element::f64, reinterpret_cast<const unsigned char*>(pi.data())) == 3.141592653589793);
}

TEST_CASE("peek: a shape is numbers > 0 separated by ',' or 'x', and anything else is refused by name", "[peek_view]") {
  CHECK(parse_shape("4,1024") == std::vector<std::uint64_t>{4, 1024});
  CHECK(parse_shape("4x1024") == std::vector<std::uint64_t>{4, 1024});
  CHECK(parse_shape("2x3,4") == std::vector<std::uint64_t>{2, 3, 4});
  CHECK(parse_shape("7") == std::vector<std::uint64_t>{7});
  CHECK(parse_shape(" 2, 3 ") == std::vector<std::uint64_t>{2, 3});
  CHECK_THROWS_AS(parse_shape(""), std::invalid_argument);
  CHECK_THROWS_WITH(parse_shape("4,0"), Contains("'0'") && Contains("4,0"));
  CHECK_THROWS_WITH(parse_shape("4,,2"), Contains("''"));
  CHECK_THROWS_WITH(parse_shape("4,2,"), Contains("''"));
  CHECK_THROWS_WITH(parse_shape("4,-1"), Contains("'-1'"));
  CHECK_THROWS_WITH(parse_shape("4,1k"), Contains("'1k'"));
  CHECK_THROWS_WITH(parse_shape("abc"), Contains("'abc'"));
  CHECK_THROWS_WITH(parse_shape("99999999999999999999999"), Contains("'99999999999999999999999'"));
}

TEST_CASE("peek: a shape must cover the bytes exactly, and the error says both sides", "[peek_view]") {
  CHECK_NOTHROW(check_shape({4, 1024}, element::f32, 16384));
  CHECK_NOTHROW(check_shape({}, element::f32, 16));
  CHECK_NOTHROW(check_shape({}, element::f32, 0));
  CHECK_THROWS_WITH(check_shape({4, 1024}, element::f32, 1000),
                    Contains("4096") && Contains("16384 bytes") && Contains("1000 bytes") && Contains("250 elements"));
  CHECK_THROWS_WITH(check_shape({4, 1024}, element::f32, 16386), Contains("not a whole number"));
  CHECK_THROWS_WITH(check_shape({}, element::f32, 6), Contains("6 bytes") && Contains("f32"));
  CHECK_THROWS_WITH(check_shape({1ULL << 40, 1ULL << 40}, element::u8, 1), Contains("too large"));
  CHECK_THROWS_WITH(check_shape({1ULL << 62}, element::f32, 0), Contains("too large"));  // bytes overflow
  CHECK_THROWS_AS(check_shape({2, 0}, element::u8, 0), std::invalid_argument);
}

TEST_CASE("peek: the summary counts NaN and infinities apart and takes min, max and mean over finite values",
          "[peek_view]") {
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  const float finf = std::numeric_limits<float>::infinity();
  const summary s = summarize(element::f32, f32_bytes({1, fnan, finf, -finf, -2, 4, finf}));
  CHECK(s.count == 7);
  CHECK(s.nan == 1);
  CHECK(s.pos_inf == 2);
  CHECK(s.neg_inf == 1);
  CHECK(s.min == -2.0);
  CHECK(s.max == 4.0);
  CHECK(s.mean == 1.0);

  const summary ints = summarize(element::i8, le_bytes({0xff, 0x05, 0x80, 0x00}, 1));
  CHECK(ints.count == 4);
  CHECK(ints.nan == 0);
  CHECK(ints.min == -128.0);
  CHECK(ints.max == 5.0);
  CHECK(ints.mean == -31.0);
}

TEST_CASE("peek: a summary without a finite value has NaN min, max and mean, and a partial element is refused",
          "[peek_view]") {
  const summary none = summarize(element::f16, le_bytes({0x7e00, 0x7c00}, 2));
  CHECK(none.count == 2);
  CHECK(none.nan == 1);
  CHECK(none.pos_inf == 1);
  CHECK(std::isnan(none.min));
  CHECK(std::isnan(none.max));
  CHECK(std::isnan(none.mean));
  const summary empty = summarize(element::f32, "");
  CHECK(empty.count == 0);
  CHECK(std::isnan(empty.mean));
  CHECK_THROWS_AS(summarize(element::f32, std::string(7, '\0')), std::invalid_argument);
  CHECK_THROWS_AS(summarize(element::f16, std::string(3, '\0')), std::invalid_argument);
}

TEST_CASE("peek: the mean neither loses small values among large ones nor overflows on large f64 values",
          "[peek_view]") {
  // A plain sum gives (1e16 + 1) - 1e16 = 0 in doubles.
  CHECK(summarize(element::f64, f64_bytes({1e16, 1, -1e16})).mean == Approx(1.0 / 3));
  const double big = std::numeric_limits<double>::max();
  const summary s = summarize(element::f64, f64_bytes({big, big, qnan}));
  CHECK(s.mean == big);
  CHECK(s.max == big);
  CHECK(s.nan == 1);
}

TEST_CASE("peek: the summary's JSON has every count, round-tripping numbers, and null for NaN", "[peek_view]") {
  summary s;
  s.count = 7;
  s.nan = 1;
  s.pos_inf = 2;
  s.neg_inf = 1;
  s.min = -2;
  s.max = 0.1;
  s.mean = 1.0 / 3;
  const std::string json = summary_json(s);
  CHECK(json == R"({"count":7,"nan":1,"pos_inf":2,"neg_inf":1,"min":-2,"max":0.1,"mean":0.3333333333333333})");
  CHECK(std::stod(json.substr(json.find("\"mean\":") + 7)) == 1.0 / 3);
  s.min = s.max = s.mean = qnan;
  CHECK(summary_json(s) == R"({"count":7,"nan":1,"pos_inf":2,"neg_inf":1,"min":null,"max":null,"mean":null})");
}

TEST_CASE("peek: the hex dump is xxd's layout at GPU addresses, a short last line padded to the same columns",
          "[peek_view]") {
  std::ostringstream out;
  write_hexdump(out, 0x00007f0000001000, std::string("Hello world\0\0\0\0\0AB\x01", 19));
  const std::string expected = "00007f0000001000: 4865 6c6c 6f20 776f 726c 6400 0000 0000  Hello world.....\n"
                               "00007f0000001010: 4142 01" +
                               std::string(32, ' ') + "  AB.\n";
  CHECK(out.str() == expected);
  const std::string text = out.str();
  const std::size_t second = text.find('\n') + 1;
  CHECK(text.find("AB.") - second == text.find("Hello"));  // the ASCII columns line up

  std::ostringstream high;
  write_hexdump(high, 0xfffffffffffffff0, std::string("\x7f\x80 ~", 4));
  CHECK(high.str() == "fffffffffffffff0: 7f80 207e" + std::string(30, ' ') + "  .. ~\n");

  std::ostringstream none;
  write_hexdump(none, 0x1000, "");
  CHECK(none.str().empty());
}

TEST_CASE("peek: values are shown a row of the last dimension a line, each prefixed by its first index",
          "[peek_view]") {
  CHECK(values_text(element::i32, {2, 3}, le_bytes({1, 2, 3, 4, 0xfffffffb, 6}, 4)) == "[0,0] 1 2 3\n[1,0] 4 -5 6\n");
  CHECK(values_text(element::u8, {2, 2, 2}, le_bytes({0, 1, 2, 3, 4, 5, 6, 255}, 1)) ==
        "[0,0,0] 0 1\n[0,1,0] 2 3\n[1,0,0] 4 5\n[1,1,0] 6 255\n");
  // Without a shape, 8 a line, the prefixes padded so that the values start in one column.
  CHECK(values_text(element::i8, {}, le_bytes({0, 1, 2, 3, 4, 5, 6, 7, 8, 0x80}, 1)) ==
        "[0] 0 1 2 3 4 5 6 7\n[8] 8 -128\n");
  CHECK(values_text(element::u8, {}, std::string(17, '\x01')) ==
        "[0]  1 1 1 1 1 1 1 1\n[8]  1 1 1 1 1 1 1 1\n[16] 1\n");
  CHECK(values_text(element::u8, {}, "").empty());
}

TEST_CASE("peek: floats are shown with 7 significant digits and nan, inf, -inf; integers exactly", "[peek_view]") {
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  const float finf = std::numeric_limits<float>::infinity();
  CHECK(values_text(element::f32, {}, f32_bytes({0.1f, 1.0f / 3, 1e10f, -fnan, finf, -finf, -0.5f, 123456789.0f})) ==
        "[0] 0.1 0.3333333 1e+10 nan inf -inf -0.5 1.234568e+08\n");
  CHECK(values_text(element::f16, {2}, le_bytes({0x3c00, 0x0001}, 2)) == "[0] 1 5.960464e-08\n");
  CHECK(values_text(element::i64, {2}, le_bytes({0x7fffffffffffffff, 0x8000000000000000}, 8)) ==
        "[0] 9223372036854775807 -9223372036854775808\n");
}

TEST_CASE("peek: rows past the line limit are counted in one last line", "[peek_view]") {
  const std::string bytes(100, '\0');  // 13 lines of 8
  const std::string text = values_text(element::u8, {}, bytes, 4);
  CHECK(text == "[0]  0 0 0 0 0 0 0 0\n[8]  0 0 0 0 0 0 0 0\n[16] 0 0 0 0 0 0 0 0\n[24] 0 0 0 0 0 0 0 0\n"
                "... 9 more lines\n");
  CHECK(values_text(element::u8, {5, 2}, std::string(10, '\0'), 4).ends_with("[3,0] 0 0\n... 1 more line\n"));
  CHECK(values_text(element::u8, {5, 2}, std::string(10, '\0'), 5).ends_with("[4,0] 0 0\n"));
  CHECK(values_text(element::u8, {5, 2}, std::string(10, '\0'), 0) == "... 5 more lines\n");
  CHECK_THROWS_AS(values_text(element::u8, {5, 3}, std::string(10, '\0')), std::invalid_argument);
  CHECK_THROWS_AS(values_text(element::f32, {}, std::string(10, '\0')), std::invalid_argument);
}

namespace {

// The header of a .npy file, after checking its preamble: magic, version 1.0, a length that ends at 64 bytes.
std::string npy_header(const std::string& file) {
  REQUIRE(file.size() >= 10);
  CHECK(file.substr(0, 6) == "\x93NUMPY");
  CHECK(file[6] == '\x01');
  CHECK(file[7] == '\x00');
  const std::size_t length = static_cast<unsigned char>(file[8]) | static_cast<unsigned char>(file[9]) << 8;
  CHECK((10 + length) % 64 == 0);
  REQUIRE(file.size() >= 10 + length);
  const std::string header = file.substr(10, length);
  CHECK(header.front() == '{');
  CHECK(header.back() == '\n');
  return header;
}

}  // namespace

TEST_CASE("peek: a .npy file has numpy's preamble, a header padded to 64 bytes, then the data unchanged",
          "[peek_view]") {
  const std::string data = f32_bytes({1, 2, 3, 4, 5, 6});
  const std::string file = npy_file(element::f32, {2, 3}, data);
  const std::string header = npy_header(file);
  CHECK(header == "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') + "\n");
  CHECK_THAT(header, Contains("'descr': '<f4'") && Contains("'shape': (2, 3),") && Contains("'fortran_order': False"));
  CHECK(file.substr(10 + header.size()) == data);

  const std::string flat = npy_file(element::u8, {}, "abcdef");
  CHECK_THAT(npy_header(flat), Contains("'descr': '|u1'") && Contains("'shape': (6,),"));
  CHECK(flat.ends_with("\nabcdef"));
  CHECK_THAT(npy_header(npy_file(element::f64, {1}, f64_bytes({1}))), Contains("'descr': '<f8'") && Contains("(1,)"));
}

TEST_CASE("peek: .npy keeps numpy's types, and raw bit patterns for bf16 and fp8", "[peek_view]") {
  const auto descr = [](element e) { return npy_header(npy_file(e, {}, std::string(element_size(e) * 3, '\0'))); };
  CHECK_THAT(descr(element::f16), Contains("'<f2'"));
  CHECK_THAT(descr(element::bf16), Contains("'<u2'"));
  CHECK_THAT(descr(element::i8), Contains("'|i1'"));
  CHECK_THAT(descr(element::i32), Contains("'<i4'"));
  CHECK_THAT(descr(element::i64), Contains("'<i8'"));
  CHECK_THAT(descr(element::fp8e4m3), Contains("'|u1'"));
  CHECK_THAT(descr(element::fp8e5m2), Contains("'|u1'"));
  CHECK_THAT(descr(element::f16), Contains("(3,)"));
  CHECK_THROWS_AS(npy_file(element::f32, {2, 3}, std::string(20, '\0')), std::invalid_argument);
  // A header that needs a second 64-byte block still ends on one.
  const std::string many = npy_file(element::u8, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, "x");
  CHECK(npy_header(many).size() + 10 == 128);
}
