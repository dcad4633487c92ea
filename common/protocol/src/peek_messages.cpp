// The messages of the CPU's window into a live program's memory (docs/peek.md): peek, poke and regions.
#include <cctype>

#include "message_codec.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::control {
namespace {

using namespace json_fields;
using namespace codec;

constexpr peek_order all_orders[] = {peek_order::live, peek_order::ordered, peek_order::quiesce};
constexpr peek_path all_paths[] = {peek_path::copy, peek_path::map};
constexpr auto max_peek_hold = std::chrono::hours(1);

// The fields peek and poke share: the range, and how it is ordered with the program's work.
void encode_range_request(ojson& j, std::uint64_t addr, std::uint64_t size, const std::string& name, peek_order order,
                          std::chrono::milliseconds hold_deadline, std::int64_t valid_until_ms) {
  j["addr"] = hex(addr);
  j["size"] = size;
  if (!name.empty()) j["name"] = name;
  j["order"] = name_of(order);
  j["hold_deadline_ms"] = hold_deadline.count();
  j["valid_until_ms"] = valid_until_ms;
}

template <typename Request>
Request decode_range_request(const json& root) {
  Request r;
  r.addr = address_of(root, "", "addr");
  r.size = u64_of(root, "", "size");
  if (optional_field(root, "name") != nullptr) {
    r.name = string_of(root, "", "name");
    if (!valid_range_name(r.name)) throw decode_error("name: not a valid range name");
  }
  r.order = enum_at(field(root, "", "order"), "order", all_orders);
  r.hold_deadline = std::chrono::milliseconds(i64_of(root, "", "hold_deadline_ms"));
  if (r.hold_deadline <= std::chrono::milliseconds(0) || r.hold_deadline > max_peek_hold)
    throw decode_error("hold_deadline_ms: out of range (1 ms to 1 h)");
  r.valid_until_ms = i64_of(root, "", "valid_until_ms");
  return r;
}

ojson encode_range(const peek_range& r) {
  ojson j{{"addr", hex(r.addr)},
          {"size", r.size},
          {"device", r.device},
          {"allocation", hex(r.allocation)},
          {"allocation_size", r.allocation_size}};
  if (!r.name.empty()) j["name"] = r.name;
  return j;
}

peek_range decode_range(const json& root) {
  const json& j = object_at(field(root, "", "range"), "range");
  peek_range r{address_of(j, "range", "addr"),        u64_of(j, "range", "size"),
               int_of(j, "range", "device"),          address_of(j, "range", "allocation"),
               u64_of(j, "range", "allocation_size"), {}};
  if (optional_field(j, "name") != nullptr) r.name = string_of(j, "range", "name");
  if (r.addr < r.allocation || r.size > r.allocation_size || r.addr - r.allocation > r.allocation_size - r.size)
    throw decode_error("range: not inside its allocation");
  return r;
}

}  // namespace

std::string_view name_of(peek_order o) {
  switch (o) {
    case peek_order::live: return "live";
    case peek_order::ordered: return "ordered";
    case peek_order::quiesce: return "quiesce";
  }
  return "live";
}

std::string_view name_of(peek_path p) { return p == peek_path::map ? "map" : "copy"; }

bool valid_range_name(std::string_view name) {
  if (name.empty() || name.size() > max_name_length) return false;
  bool all_digits = true;
  for (const char c : name) {
    if (c <= ' ' || c > '~') return false;
    all_digits = all_digits && std::isxdigit(static_cast<unsigned char>(c)) != 0;
  }
  return !all_digits && name.rfind("0x", 0) != 0;
}

namespace codec {

void encode_request(ojson& j, const peek_request& r) {
  j["op"] = name_of(op::peek);
  encode_range_request(j, r.addr, r.size, r.name, r.order, r.hold_deadline, r.valid_until_ms);
  j["via"] = name_of(r.via);
}
void encode_request(ojson& j, const poke_request& r) {
  j["op"] = name_of(op::poke);
  encode_range_request(j, r.addr, r.size, r.name, r.order, r.hold_deadline, r.valid_until_ms);
}
void encode_request(ojson& j, const regions_request&) { j["op"] = name_of(op::regions); }

request decode_peek_request(const json& root) {
  auto r = decode_range_request<peek_request>(root);
  r.via = enum_at(field(root, "", "via"), "via", all_paths);
  return r;
}
request decode_poke_request(const json& root) {
  auto r = decode_range_request<poke_request>(root);
  if (r.size == 0) throw decode_error("size: a poke writes at least one byte");
  return r;
}

}  // namespace codec

std::string encode(const peek_reply& r) {
  return reply(
      {{"range", encode_range(r.range)},
       {"order", name_of(r.order)},
       {"via", name_of(r.via)},
       {"held_us", r.held_us},
       {"pieces", array_of_each(r.pieces, [](const peek_piece& p) {
          return ojson{{"addr", hex(p.addr)}, {"size", p.size}, {"offset", p.offset}, {"handle_size", p.handle_size}};
        })}});
}

std::string encode(const poke_reply& r) { return reply({{"range", encode_range(r.range)}, {"held_us", r.held_us}}); }

std::string encode(const regions_reply& r) {
  return reply({{"pools", array_of_each(r.pools,
                                        [](const pool_contents& p) {
                                          ojson pj{{"device", p.device},
                                                   {"base", hex(p.base)},
                                                   {"size", p.size},
                                                   {"allocation_count", p.allocation_count}};
                                          if (p.vmm) pj["kind"] = "vmm";
                                          return pj;
                                        })},
                {"names", array_of_each(r.names, [](const named_range& n) {
                   return ojson{{"name", n.name}, {"addr", hex(n.addr)}, {"size", n.size}};
                 })}});
}

template <>
std::variant<peek_reply, failure_reply> decode_reply<peek_reply>(const std::string& payload) {
  return decode_reply_with<peek_reply>(payload, [](const json& root) {
    peek_reply r;
    r.range = decode_range(root);
    r.order = enum_at(field(root, "", "order"), "order", all_orders);
    r.via = enum_at(field(root, "", "via"), "via", all_paths);
    r.held_us = u64_of(root, "", "held_us");
    if (array_of(root, "", "pieces").size() > static_cast<std::size_t>(protocol::max_fds_per_message))
      throw decode_error("pieces: more than one frame's descriptors");
    std::uint64_t next = r.range.addr;
    for_each_object(root, "", "pieces", [&](const json& pj, const std::string& p) {
      peek_piece piece{address_of(pj, p, "addr"), u64_of(pj, p, "size"), u64_of(pj, p, "offset"),
                       u64_of(pj, p, "handle_size")};
      if (piece.addr != next || piece.size == 0 || piece.offset > piece.handle_size ||
          piece.size > piece.handle_size - piece.offset)
        throw decode_error(p + ": not the next part of the range inside its handle");
      next += piece.size;
      r.pieces.push_back(piece);
    });
    if (r.via == peek_path::map && next != r.range.addr + r.range.size)
      throw decode_error("pieces: do not cover the range");
    return r;
  });
}

template <>
std::variant<poke_reply, failure_reply> decode_reply<poke_reply>(const std::string& payload) {
  return decode_reply_with<poke_reply>(payload, [](const json& root) {
    return poke_reply{decode_range(root), u64_of(root, "", "held_us")};
  });
}

template <>
std::variant<regions_reply, failure_reply> decode_reply<regions_reply>(const std::string& payload) {
  return decode_reply_with<regions_reply>(payload, [](const json& root) {
    regions_reply r;
    for_each_object(root, "", "pools", [&](const json& pj, const std::string& p) {
      pool_contents c;
      c.device = int_of(pj, p, "device");
      c.base = address_of(pj, p, "base");
      c.size = u64_of(pj, p, "size");
      c.allocation_count = u64_of(pj, p, "allocation_count");
      const json* kind = optional_field(pj, "kind");
      c.vmm = kind != nullptr && string_at(*kind, join(p, "kind")) == "vmm";
      r.pools.push_back(std::move(c));
    });
    if (array_of(root, "", "names").size() > max_names) throw decode_error("names: more than a program may have");
    for_each_object(root, "", "names", [&](const json& nj, const std::string& p) {
      named_range n{string_of(nj, p, "name"), address_of(nj, p, "addr"), u64_of(nj, p, "size")};
      if (!valid_range_name(n.name)) throw decode_error(join(p, "name") + ": not a valid range name");
      r.names.push_back(std::move(n));
    });
    return r;
  });
}

namespace codec {

std::vector<example> peek_examples(const device_description& device) {
  const peek_range range{0x200000001000, 4096, device.ordinal, 0x200000000000, 67108864, "kv.layer0"};
  const peek_range scalar{0x200000000200, 4, device.ordinal, 0x200000000000, 67108864, ""};
  pool_contents pool{device.ordinal, 0x200000000000, 549755813888, 0, 2, {}, {}, false};
  return {
      {op::peek,
       encode(request{peek_request{0x1000, 4096, "kv.layer0", peek_order::ordered, peek_path::map,
                                   std::chrono::milliseconds(10'000), 1795430130000}}),
       encode(peek_reply{range, peek_order::ordered, peek_path::map, 0, {{0x200000001000, 4096, 4096, 67108864}}})},
      {op::poke,
       encode(request{
           poke_request{0x200000000200, 4, "", peek_order::quiesce, std::chrono::milliseconds(10'000), 1795430130000}}),
       encode(poke_reply{scalar, 850})},
      {op::regions, encode(request{regions_request{}}),
       encode(regions_reply{{pool}, {{"kv.layer0", 0x200000001000, 1048576}}})},
  };
}

}  // namespace codec
}  // namespace vmmckpt::control
