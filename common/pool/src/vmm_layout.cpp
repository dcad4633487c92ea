// The rules and the JSON of a VMM layout, shared by the image and the control channel.
#include "vmmckpt/pool/vmm_layout.hpp"

#include <algorithm>

#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt {
namespace {

using namespace json_fields;
using ojson = nlohmann::ordered_json;

bool inside(std::uint64_t addr, std::uint64_t size, std::uint64_t lo, std::uint64_t end) {
  return addr >= lo && addr <= end && size <= end - addr;
}

std::string at(const std::string& path, const char* list, std::size_t i) { return index(join(path, list), i); }

std::string properties_hex(const vmm_properties& p) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char b : p.bytes) {
    s += digits[b >> 4];
    s += digits[b & 0xf];
  }
  return s;
}

vmm_properties properties_at(const json& v, const std::string& path) {
  const std::string text = string_at(v, path);
  vmm_properties p;
  if (text.size() != 2 * p.bytes.size())
    throw decode_error(path + ": expected " + std::to_string(2 * p.bytes.size()) + " hex digits");
  auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw decode_error(path + ": expected lowercase hex digits");
  };
  for (std::size_t i = 0; i < p.bytes.size(); ++i)
    p.bytes[i] = static_cast<unsigned char>(digit(text[2 * i]) << 4 | digit(text[2 * i + 1]));
  return p;
}

// Imports: sorted, disjoint from each other and from the mappings, each inside one reservation, naming a
// token of the exporter's and a part of its handle.
std::string check_imports(const vmm_layout& l, const std::string& path) {
  std::size_t r = 0, m = 0;
  for (std::size_t i = 0; i < l.imports.size(); ++i) {
    const vmm_import& x = l.imports[i];
    const std::string p = at(path, "imports", i);
    if (x.size == 0 || x.size > UINT64_MAX - x.addr) return p + " is empty or passes the end of the address space";
    if (i > 0 && x.addr < l.imports[i - 1].addr + l.imports[i - 1].size)
      return p + " overlaps or precedes the import before it";
    while (r < l.reservations.size() && l.reservations[r].addr + vmm_span(l.reservations[r].size) <= x.addr) ++r;
    if (r == l.reservations.size() ||
        !inside(x.addr, x.size, l.reservations[r].addr, l.reservations[r].addr + vmm_span(l.reservations[r].size)))
      return p + " (" + hex(x.addr) + "+" + std::to_string(x.size) + ") is not inside one reservation";
    while (m < l.mappings.size() && l.mappings[m].addr + l.mappings[m].size <= x.addr) ++m;
    if (m < l.mappings.size() && l.mappings[m].addr < x.addr + x.size) return p + " overlaps a mapping";
    if (x.exporter_pid <= 0) return p + ".exporter_pid " + std::to_string(x.exporter_pid) + " is not a process";
    if (!looks_like_vmm_token(x.token)) return p + ".token " + hex(x.token) + " is not a handle token";
    if (!inside(x.offset, x.size, 0, x.handle_size)) return p + " reaches past the end of the exporter's handle";
  }
  return {};
}

// The windows: granule-aligned, every device's inside the address space; the token counter in range.
std::string check_windows(const vmm_layout& l, const std::string& path) {
  const std::uint64_t base = l.windows.base, window = l.windows.window;
  if (window == 0 || window % vmm_granularity != 0 || base % vmm_granularity != 0)
    return join(path, "windows") + ": base " + hex(base) + " and window " + std::to_string(window) +
           " must be non-zero multiples of " + std::to_string(vmm_granularity);
  if (static_cast<std::uint64_t>(max_devices) > (UINT64_MAX - base) / window)
    return join(path, "windows") + ": the windows overflow the address space";
  if (l.next_token == 0 || l.next_token > vmm_token_counter_mask + 1)
    return join(path, "next_token") + " " + std::to_string(l.next_token) + " is out of range";
  return {};
}

// Reservations: sorted, disjoint, each granule-aligned inside its device's window.
std::string check_reservations(const vmm_layout& l, const std::string& path) {
  for (std::size_t i = 0; i < l.reservations.size(); ++i) {
    const vmm_reservation& r = l.reservations[i];
    const std::string p = at(path, "reservations", i);
    if (r.device < 0 || r.device >= max_devices) return p + ".device " + std::to_string(r.device) + " is out of range";
    const std::uint64_t w = l.windows.device_base(r.device);
    if (r.size == 0 || r.size > l.windows.window || r.addr % vmm_granularity != 0 ||
        !inside(r.addr, vmm_span(r.size), w, w + l.windows.window))
      return p + " (" + hex(r.addr) + "+" + std::to_string(r.size) + ") is not a granule-aligned range inside device " +
             std::to_string(r.device) + "'s window";
    if (i > 0) {
      const vmm_reservation& q = l.reservations[i - 1];
      if (r.addr < q.addr + vmm_span(q.size)) return p + " overlaps or precedes the reservation before it";
    }
  }
  return {};
}

// Handles: in token order, each a token this layout handed out, of whole granules, on a device in range.
std::string check_handles(const vmm_layout& l, const std::string& path) {
  for (std::size_t i = 0; i < l.handles.size(); ++i) {
    const vmm_handle& h = l.handles[i];
    const std::string p = at(path, "handles", i);
    if (!looks_like_vmm_token(h.token) || (h.token & vmm_token_counter_mask) >= l.next_token)
      return p + ".token " + hex(h.token) + " is not a token this layout handed out";
    if (i > 0 && h.token <= l.handles[i - 1].token) return p + ".token is out of order or repeated";
    if (h.size == 0 || h.size % vmm_granularity != 0)
      return p + ".size " + std::to_string(h.size) + " is not a positive multiple of " +
             std::to_string(vmm_granularity);
    if (h.device < 0 || h.device >= max_devices) return p + ".device " + std::to_string(h.device) + " is out of range";
  }
  return {};
}

// Mappings: sorted, disjoint, each inside one reservation and its handle; every handle referenced or mapped.
std::string check_mappings(const vmm_layout& l, const std::string& path) {
  auto handle_of = [&](std::uint64_t token) -> const vmm_handle* {
    const auto it = std::lower_bound(l.handles.begin(), l.handles.end(), token,
                                     [](const vmm_handle& h, std::uint64_t t) { return h.token < t; });
    return it != l.handles.end() && it->token == token ? &*it : nullptr;
  };
  std::vector<bool> mapped(l.handles.size(), false);
  std::size_t r = 0;
  for (std::size_t i = 0; i < l.mappings.size(); ++i) {
    const vmm_mapping& m = l.mappings[i];
    const std::string p = at(path, "mappings", i);
    if (m.size == 0) return p + " is empty";
    if (i > 0 && m.addr < l.mappings[i - 1].addr + l.mappings[i - 1].size)
      return p + " overlaps or precedes the mapping before it";
    while (r < l.reservations.size() && l.reservations[r].addr + vmm_span(l.reservations[r].size) <= m.addr) ++r;
    if (r == l.reservations.size() ||
        !inside(m.addr, m.size, l.reservations[r].addr, l.reservations[r].addr + vmm_span(l.reservations[r].size)))
      return p + " (" + hex(m.addr) + "+" + std::to_string(m.size) + ") is not inside one reservation";
    const vmm_handle* h = handle_of(m.token);
    if (h == nullptr) return p + ".token " + hex(m.token) + " names no handle";
    if (!inside(m.offset, m.size, 0, h->size)) return p + " reaches past the end of its handle";
    mapped[static_cast<std::size_t>(h - l.handles.data())] = true;
  }
  for (std::size_t i = 0; i < l.handles.size(); ++i)
    if (l.handles[i].refs == 0 && !mapped[i]) return at(path, "handles", i) + " has neither a reference nor a mapping";
  return {};
}

// Access rights: sorted, disjoint, locations in order, each range lying over what is mapped (the program's
// mappings and the imports, in one address order) without a hole.
std::string check_access(const vmm_layout& l, const std::string& path) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> mapped_ranges;
  for (const vmm_mapping& x : l.mappings) mapped_ranges.emplace_back(x.addr, x.size);
  for (const vmm_import& x : l.imports) mapped_ranges.emplace_back(x.addr, x.size);
  std::sort(mapped_ranges.begin(), mapped_ranges.end());
  std::size_t m = 0;
  for (std::size_t i = 0; i < l.access.size(); ++i) {
    const vmm_access_range& a = l.access[i];
    const std::string p = at(path, "access", i);
    if (a.size == 0 || a.access.empty()) return p + " is empty";
    if (a.size > UINT64_MAX - a.addr) return p + " passes the end of the address space";
    for (std::size_t k = 1; k < a.access.size(); ++k) {
      const vmm_access &x = a.access[k - 1], &y = a.access[k];
      if (x.location_type > y.location_type || (x.location_type == y.location_type && x.location_id >= y.location_id))
        return index(join(p, "rights"), k) + " is out of order or repeats a location";
    }
    if (i > 0 && a.addr < l.access[i - 1].addr + l.access[i - 1].size)
      return p + " overlaps or precedes the range before it";
    // Wholly mapped: the mappings from the one holding its start cover it without a hole.
    while (m < mapped_ranges.size() && mapped_ranges[m].first + mapped_ranges[m].second <= a.addr) ++m;
    std::uint64_t covered = a.addr;
    for (std::size_t k = m; k < mapped_ranges.size() && mapped_ranges[k].first <= covered && covered < a.addr + a.size;
         ++k)
      covered = mapped_ranges[k].first + mapped_ranges[k].second;
    if (covered < a.addr + a.size)
      return p + " (" + hex(a.addr) + "+" + std::to_string(a.size) + ") is not wholly mapped";
  }
  return {};
}

}  // namespace

bool vmm_layout::operator==(const vmm_layout& o) const {
  auto same_handles = [&] {
    if (handles.size() != o.handles.size()) return false;
    for (std::size_t i = 0; i < handles.size(); ++i) {
      const vmm_handle &a = handles[i], &b = o.handles[i];
      if (a.token != b.token || a.size != b.size || a.device != b.device || a.flags != b.flags ||
          a.properties != b.properties || a.refs != b.refs)
        return false;
    }
    return true;
  };
  return windows.base == o.windows.base && windows.window == o.windows.window && next_token == o.next_token &&
         reservations == o.reservations && same_handles() && mappings == o.mappings && access == o.access &&
         imports == o.imports;
}

std::string check(const vmm_layout& l, const std::string& path) {
  // In this order: each rule relies on those before it (the mappings on sorted handles and reservations).
  for (const auto rule :
       {check_windows, check_reservations, check_handles, check_mappings, check_imports, check_access})
    if (std::string why = rule(l, path); !why.empty()) return why;
  return {};
}

ojson to_json(const vmm_layout& l) {
  ojson j;
  j["window_base"] = hex(l.windows.base);
  j["window_size"] = l.windows.window;
  j["next_token"] = l.next_token;
  j["reservations"] = ojson::array();
  for (const auto& r : l.reservations)
    j["reservations"].push_back({{"addr", hex(r.addr)}, {"size", r.size}, {"device", r.device}});
  j["handles"] = ojson::array();
  for (const auto& h : l.handles)
    j["handles"].push_back({{"token", hex(h.token)},
                            {"size", h.size},
                            {"device", h.device},
                            {"flags", h.flags},
                            {"refs", h.refs},
                            {"properties", properties_hex(h.properties)}});
  j["mappings"] = ojson::array();
  for (const auto& m : l.mappings)
    j["mappings"].push_back({{"addr", hex(m.addr)}, {"size", m.size}, {"token", hex(m.token)}, {"offset", m.offset}});
  j["access"] = ojson::array();
  for (const auto& a : l.access) {
    ojson list = ojson::array();
    for (const auto& x : a.access)
      list.push_back({{"type", x.location_type}, {"id", x.location_id}, {"flags", x.flags}});
    j["access"].push_back({{"addr", hex(a.addr)}, {"size", a.size}, {"rights", std::move(list)}});
  }
  if (!l.imports.empty()) {  // absent when none: what images before imports were recorded look like
    j["imports"] = ojson::array();
    for (const auto& x : l.imports)
      j["imports"].push_back({{"addr", hex(x.addr)},
                              {"size", x.size},
                              {"offset", x.offset},
                              {"exporter_pid", x.exporter_pid},
                              {"exporter_start", x.exporter_start},
                              {"token", hex(x.token)},
                              {"handle_size", x.handle_size},
                              {"device_uuid", x.device_uuid}});
  }
  return j;
}

vmm_layout vmm_layout_from_json(const json& j, const std::string& path) {
  object_at(j, path);
  vmm_layout l;
  l.windows.base = address_of(j, path, "window_base");
  l.windows.window = u64_of(j, path, "window_size");
  l.next_token = u64_of(j, path, "next_token");
  for_each_object(j, path, "reservations", [&](const json& o, const std::string& p) {
    l.reservations.push_back({address_of(o, p, "addr"), u64_of(o, p, "size"), int_of(o, p, "device")});
  });
  for_each_object(j, path, "handles", [&](const json& o, const std::string& p) {
    vmm_handle h;
    h.token = address_of(o, p, "token");
    h.size = u64_of(o, p, "size");
    h.device = int_of(o, p, "device");
    h.flags = u64_of(o, p, "flags");
    h.refs = u32_of(o, p, "refs");
    h.properties = properties_at(field(o, p, "properties"), join(p, "properties"));
    l.handles.push_back(h);
  });
  for_each_object(j, path, "mappings", [&](const json& o, const std::string& p) {
    l.mappings.push_back(
        {address_of(o, p, "addr"), u64_of(o, p, "size"), address_of(o, p, "token"), u64_of(o, p, "offset")});
  });
  for_each_object(j, path, "access", [&](const json& o, const std::string& p) {
    vmm_access_range a{address_of(o, p, "addr"), u64_of(o, p, "size"), {}};
    for_each_object(o, p, "rights", [&](const json& x, const std::string& q) {
      a.access.push_back({int_of(x, q, "type"), int_of(x, q, "id"), u64_of(x, q, "flags")});
    });
    l.access.push_back(std::move(a));
  });
  if (optional_field(j, "imports") != nullptr) {
    for_each_object(j, path, "imports", [&](const json& o, const std::string& p) {
      l.imports.push_back({address_of(o, p, "addr"), u64_of(o, p, "size"), u64_of(o, p, "offset"),
                           i64_of(o, p, "exporter_pid"), u64_of(o, p, "exporter_start"), address_of(o, p, "token"),
                           u64_of(o, p, "handle_size"), string_of(o, p, "device_uuid")});
    });
  }
  return l;
}

}  // namespace vmmckpt
