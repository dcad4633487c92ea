// Strict JSON field readers shared by the image manifest and the control messages.
#include "vmmckpt/support/json_fields.hpp"

#include <climits>
#include <cmath>

#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::json_fields {
namespace {

[[noreturn]] void fail(const std::string& message) { throw decode_error(message); }

std::string at_path(const std::string& path, const std::string& what) {
  return path.empty() ? what : path + ": " + what;
}

}  // namespace

namespace {

// The deepest nesting of arrays and objects in text, stopping once it passes `limit`. One pass over the
// bytes: nlohmann's parser callback, which could do this while parsing, makes it rescan the
// enclosing array at every closing object (quadratic in the number of allocations of a manifest).
std::size_t nesting_depth(const std::string& text, std::size_t limit) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json parse_limited(const std::string& text, std::size_t max_depth) {
  // Deep nesting is refused before parsing: nothing legitimate needs it and it costs memory and time.
  // (Malformed text is left to the parser, whose message says where.)
  if (nesting_depth(text, max_depth) > max_depth)
    fail("JSON nested deeper than " + std::to_string(max_depth) + " levels");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    // The parser quotes the bytes it stopped at, which may be broken UTF-8: escaped, the message
    // stays printable and can go into JSON output (cuda-ckpt verify --json).
    fail("not valid JSON: " + printable(e.what()));
  }
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f) {
      out += c;
    } else {
      static constexpr char digits[] = "0123456789abcdef";
      out += {'\\', 'x', digits[b >> 4], digits[b & 0xf]};
    }
  }
  return out;
}

std::string join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }
std::string index(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

const json& field(const json& obj, const std::string& path, const char* key) {
  if (!obj.is_object()) fail(at_path(path, "expected an object"));
  auto it = obj.find(key);
  if (it == obj.end()) fail(at_path(path, "missing field '" + std::string(key) + "'"));
  return *it;
}

const json* optional_field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

const json& object_at(const json& v, const std::string& path) {
  if (!v.is_object()) fail(path + ": expected an object");
  return v;
}

const json& array_at(const json& v, const std::string& path) {
  if (!v.is_array()) fail(path + ": expected an array");
  return v;
}

std::uint64_t u64_at(const json& v, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  fail(path + ": expected a non-negative integer below 2^64");
}

std::uint32_t u32_at(const json& v, const std::string& path) {
  const std::uint64_t x = u64_at(v, path);
  if (x > UINT32_MAX) fail(path + ": expected an integer below 2^32");
  return static_cast<std::uint32_t>(x);
}

std::int64_t i64_at(const json& v, const std::string& path) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX))
    return static_cast<std::int64_t>(v.get<std::uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  fail(path + ": expected a 64-bit signed integer");
}

int int_at(const json& v, const std::string& path) {
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT_MAX)) return static_cast<int>(v.get<std::uint64_t>());
  } else if (v.is_number_integer()) {
    const std::int64_t x = v.get<std::int64_t>();
    if (x >= INT_MIN && x <= INT_MAX) return static_cast<int>(x);
  }
  fail(path + ": expected a 32-bit integer");
}

bool bool_at(const json& v, const std::string& path) {
  if (!v.is_boolean()) fail(path + ": expected true or false");
  return v.get<bool>();
}

double number_at(const json& v, const std::string& path) {
  if (!v.is_number()) fail(path + ": expected a number");
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(path + ": expected a finite number");
  return x;
}

std::string string_at(const json& v, const std::string& path) {
  if (!v.is_string()) fail(path + ": expected a string");
  return v.get<std::string>();
}

std::uint64_t address_at(const json& v, const std::string& path) {
  std::uint64_t out = 0;
  if (v.is_string() && parse_address(v.get_ref<const std::string&>(), out)) return out;
  fail(path + ": expected an address as a \"0x\" hex string of at most 16 digits");
}

std::uint64_t hex16_at(const json& v, const std::string& path) {
  std::uint64_t out = 0;
  if (v.is_string() && v.get_ref<const std::string&>().size() == 16 &&
      parse_hex_digits(v.get_ref<const std::string&>(), out))
    return out;
  fail(path + ": expected a checksum as a string of 16 hex digits");
}

std::vector<std::string> strings_of(const json& o, const std::string& path, const char* key) {
  const json& list = array_of(o, path, key);
  const std::string list_path = join(path, key);
  std::vector<std::string> out;
  out.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) out.push_back(string_at(list[i], index(list_path, i)));
  return out;
}

}  // namespace vmmckpt::json_fields
