// What the encoders and decoders of the control messages share (control_messages.cpp, peek_messages.cpp): the
// wire's JSON, replies that say ok, strict enums, and each family's request coders, which encode(request) and
// decode_request dispatch to.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <variant>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::control::codec {

using json_fields::json;
using ojson = nlohmann::ordered_json;  // a stable field order on the wire

// Control messages nest at most seven levels (a VMM layout's access rights); anything deeper is not ours.
inline constexpr std::size_t max_depth = 12;

inline constexpr refusal all_refusals[] = {
    refusal::failed,   refusal::bad_request,  refusal::unknown_op, refusal::suspended, refusal::not_suspended,
    refusal::not_held, refusal::not_quiesced, refusal::busy,       refusal::expired,   refusal::withdrawn};

inline std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// The value at `path`, one of `values` by its name.
template <typename Enum, std::size_t N>
Enum enum_at(const json& v, const std::string& path, const Enum (&values)[N]) {
  const std::string text = json_fields::string_at(v, path);
  for (Enum e : values)
    if (name_of(e) == text) return e;
  throw decode_error(path + ": unknown value \"" + json_fields::printable(text) + "\"");
}

// A reply that says ok: true, with its fields in order.
inline std::string reply(std::initializer_list<std::pair<const char*, ojson>> fields) {
  ojson j;
  j["ok"] = true;
  for (const auto& [name, value] : fields) j[name] = value;
  return dump(j);
}

// The object of a reply that says ok: true, or the failure_reply it holds.
template <typename Reply, typename Decode>
std::variant<Reply, failure_reply> decode_reply_with(const std::string& payload, Decode&& decode) {
  using namespace json_fields;
  const json root = parse_limited(payload, max_depth);
  object_at(root, "reply");
  if (!bool_of(root, "", "ok")) {
    failure_reply f;
    f.error = string_of(root, "", "error");
    // A process that names no code (or one this tool does not know) failed in some other way.
    const json* code = optional_field(root, "code");
    f.code = refusal::failed;
    if (code != nullptr && code->is_string())
      for (refusal r : all_refusals)
        if (name_of(r) == code->get_ref<const std::string&>()) f.code = r;
    return f;
  }
  return decode(root);
}

// peek_messages.cpp's requests: their fields after the op, and back.
void encode_request(ojson& j, const peek_request& r);
void encode_request(ojson& j, const poke_request& r);
void encode_request(ojson& j, const regions_request& r);
request decode_peek_request(const json& root);
request decode_poke_request(const json& root);
// One example of each of its ops, for example_messages().
std::vector<example> peek_examples(const device_description& device);

}  // namespace vmmckpt::control::codec
