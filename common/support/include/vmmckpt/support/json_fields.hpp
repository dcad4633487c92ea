// Strict reading of JSON from an untrusted peer (manifests, control messages): every field named, typed and bounded.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace vmmckpt::json_fields {

using json = nlohmann::json;

// What is wrong, with the field's path: "pools[0].extents[3].size: expected a non-negative integer below 2^64".
struct decode_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses text, refusing nesting deeper than max_depth. Linear in the text's size. The message of
// a syntax error is escaped to printable ASCII (it may quote broken UTF-8).
json parse_limited(const std::string& text, std::size_t max_depth);

// text with every byte outside printable ASCII written as \xNN: what a refusal may quote of its
// input, so that the message stays printable and valid in JSON output whatever the input held.
std::string printable(std::string_view text);

std::string join(const std::string& path, const char* key);  // "a.key", or "key" at the root
std::string index(const std::string& path, std::size_t i);   // "a[3]"

// The member `key` of obj (an object), or decode_error "path: missing field 'key'".
const json& field(const json& obj, const std::string& path, const char* key);
// The member `key`, or null when obj has none.
const json* optional_field(const json& obj, const char* key);

const json& object_at(const json& v, const std::string& path);
const json& array_at(const json& v, const std::string& path);
std::uint64_t u64_at(const json& v, const std::string& path);
std::uint32_t u32_at(const json& v, const std::string& path);
std::int64_t i64_at(const json& v, const std::string& path);
int int_at(const json& v, const std::string& path);
bool bool_at(const json& v, const std::string& path);
double number_at(const json& v, const std::string& path);
std::string string_at(const json& v, const std::string& path);
std::uint64_t address_at(const json& v, const std::string& path);  // "0x..." as hex() writes it
std::uint64_t hex16_at(const json& v, const std::string& path);    // 16 hex digits as hex16() writes them

// Shorthands for a member of an object: the member's path is join(path, key).
inline std::uint64_t u64_of(const json& o, const std::string& path, const char* key) {
  return u64_at(field(o, path, key), join(path, key));
}
inline std::uint32_t u32_of(const json& o, const std::string& path, const char* key) {
  return u32_at(field(o, path, key), join(path, key));
}
inline std::int64_t i64_of(const json& o, const std::string& path, const char* key) {
  return i64_at(field(o, path, key), join(path, key));
}
inline int int_of(const json& o, const std::string& path, const char* key) {
  return int_at(field(o, path, key), join(path, key));
}
inline bool bool_of(const json& o, const std::string& path, const char* key) {
  return bool_at(field(o, path, key), join(path, key));
}
inline double number_of(const json& o, const std::string& path, const char* key) {
  return number_at(field(o, path, key), join(path, key));
}
inline std::string string_of(const json& o, const std::string& path, const char* key) {
  return string_at(field(o, path, key), join(path, key));
}
inline std::uint64_t address_of(const json& o, const std::string& path, const char* key) {
  return address_at(field(o, path, key), join(path, key));
}
inline const json& array_of(const json& o, const std::string& path, const char* key) {
  return array_at(field(o, path, key), join(path, key));
}
inline const json& object_of(const json& o, const std::string& path, const char* key) {
  return object_at(field(o, path, key), join(path, key));
}

// The array `key` of `o`, each element a string.
std::vector<std::string> strings_of(const json& o, const std::string& path, const char* key);

// Calls each(object, its path) for every element of the array `key` of `o`, each of which must be an object:
// the readers' walk over a list, with the path ("pools[3]") that an error names.
template <typename Each>
void for_each_object(const json& o, const std::string& path, const char* key, Each&& each) {
  const json& list = array_of(o, path, key);
  const std::string list_path = join(path, key);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string p = index(list_path, i);
    each(object_at(list[i], p), p);
  }
}

// The array of `to_object(element)` for each element of a list: the writers' side of for_each_object.
template <typename List, typename ToObject>
nlohmann::ordered_json array_of_each(const List& list, ToObject&& to_object) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& element : list) out.push_back(to_object(element));
  return out;
}

}  // namespace vmmckpt::json_fields
