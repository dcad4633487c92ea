// The manifest as JSON: the manifest file's encoding (format 3: tables apart), the full form that
// `inspect --json` prints and formats 1 and 2 hold, and their strict decoding of hostile input.
#include <string>

#include <nlohmann/json.hpp>

#include "image_detail.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::image {
namespace {

using detail::fail;
using namespace json_fields;
// Decoding uses std::map objects: ordered_json's linear key lookup would let a hostile object
// with millions of keys make parsing quadratic. Encoding uses ordered_json for a stable field order.
using ojson = nlohmann::ordered_json;

// How the pools' tables are held: in the JSON (formats 1 and 2, and the full form of any format),
// or apart in tables.bin (the manifest file of format 3).
enum class tables { inline_, apart };

std::uint32_t decode_format(const json& root) {
  if (!root.is_object()) fail("not a JSON object (not a vmmckpt image manifest)");
  const auto magic = root.find("magic");
  if (magic == root.end()) fail("missing field 'magic' (not a vmmckpt image manifest)");
  if (!magic->is_string() || magic->get_ref<const std::string&>() != "vmmckpt-image")
    fail("magic is " + magic->dump(-1, ' ', true, json::error_handler_t::replace) +
         ", expected \"vmmckpt-image\" (not a vmmckpt image manifest)");
  const json& format = field(root, "", "format");
  if (!format.is_number_integer()) fail("format: expected an integer");
  // Checked before anything else: a newer format may have changed any other field.
  if (format.is_number_unsigned() && format.get<std::uint64_t>() > format_version)
    fail("format " + std::to_string(format.get<std::uint64_t>()) + " is newer than this tool understands (" +
         std::to_string(format_version) + ")");
  const std::int64_t f = format.get<std::int64_t>();
  if (f < 1 || f > format_version)
    fail("format " + std::to_string(f) + " is not a known format (this tool understands 1 to " +
         std::to_string(format_version) + ")");
  return static_cast<std::uint32_t>(f);
}

void decode_allocations(const json& pj, const std::string& p, pool& pl) {
  pl.allocations.reserve(array_of(pj, p, "allocations").size());
  for_each_object(pj, p, "allocations", [&](const json& a, const std::string& q) {
    allocation al;
    al.addr = address_of(a, q, "addr");
    al.size = u64_of(a, q, "size");
    const std::string api = string_of(a, q, "api");
    // Restore allocates each block again through the API that made it: a name it does not know
    // could only be guessed at.
    const auto known = alloc_api_from_name(api);
    if (!known) fail(join(q, "api") + " \"" + printable(api) + "\" is not an allocation API vmmckpt records");
    al.api = *known;
    pl.allocations.push_back(al);
  });
}

void decode_extents(const json& pj, const std::string& p, std::uint32_t format, pool& pl) {
  pl.extents.reserve(array_of(pj, p, "extents").size());
  for_each_object(pj, p, "extents", [&](const json& e, const std::string& q) {
    extent ex;
    ex.addr = address_of(e, q, "addr");
    ex.size = u64_of(e, q, "size");
    // Before format 3 an extent lay in one allocation and stored every byte of its range.
    ex.stored = format >= 3 ? u64_of(e, q, "stored") : ex.size;
    if (format >= 2) ex.file = u32_of(e, q, "file");
    ex.offset = u64_of(e, q, "offset");
    ex.checksum = hex16_at(field(e, q, "checksum"), join(q, "checksum"));
    if (format >= 5) {
      ex.blocks.reserve(array_of(e, q, "blocks").size());
      for_each_object(e, q, "blocks", [&](const json& bj, const std::string& r) {
        block bl;
        bl.checksum = hex16_at(field(bj, r, "checksum"), join(r, "checksum"));
        if (const json* in_parent = optional_field(bj, "in_parent")) {
          if (!in_parent->is_boolean()) fail(join(r, "in_parent") + ": expected true or false");
          bl.in_parent = in_parent->get<bool>();
        }
        if (const json* zero = optional_field(bj, "zero")) {
          if (!zero->is_boolean()) fail(join(r, "zero") + ": expected true or false");
          bl.zero = zero->get<bool>();
        }
        ex.blocks.push_back(bl);
      });
    }
    pl.extents.push_back(std::move(ex));
  });
}

// Decodes fields in the order the encoder writes them, so the first defect reported is the first in the file.
detail::manifest_file decode(const json& root, tables how) {
  detail::manifest_file out;
  manifest& m = out.m;
  m.format = decode_format(root);
  m.block_size = 0;  // format 5 below
  out.tables_apart = how == tables::apart;
  const bool multi_file = m.format >= 2;  // format 1: one data file, extents without `file`
  if (m.format >= 3) m.image_id = string_of(root, "", "image_id");
  m.tool_version = string_of(root, "", "tool_version");
  m.created = string_of(root, "", "created");
  m.host = string_of(root, "", "host");
  m.pid = i64_of(root, "", "pid");

  m.command = strings_of(root, "", "command");

  m.devices = decode_devices(root);

  m.pools.reserve(array_of(root, "", "pools").size());
  for_each_object(root, "", "pools", [&](const json& pj, const std::string& p) {
    pool pl;
    if (m.format >= 4) {
      if (const json* kind = optional_field(pj, "kind")) {
        const std::string k = string_at(*kind, join(p, "kind"));
        if (k == "vmm")
          pl.kind = pool_kind::vmm;
        else if (k != "pool")
          fail(join(p, "kind") + " \"" + printable(k) + "\" is not a kind of pool (\"pool\" or \"vmm\")");
      }
    }
    pl.device = int_of(pj, p, "device");
    pl.base = address_of(pj, p, "base");
    pl.size = u64_of(pj, p, "size");
    pl.granularity = u64_of(pj, p, "granularity");
    if (how == tables::apart) {
      out.allocation_counts.push_back(u64_of(pj, p, "allocation_count"));
      out.extent_counts.push_back(u64_of(pj, p, "extent_count"));
    } else {
      decode_allocations(pj, p, pl);
      decode_extents(pj, p, m.format, pl);
    }
    m.pools.push_back(std::move(pl));
  });
  m.data_bytes = u64_of(root, "", "data_bytes");
  if (multi_file) m.data_files = u32_of(root, "", "data_files");
  m.hold_us = u64_of(root, "", "hold_us");
  if (m.format >= 5) {
    m.block_size = u64_of(root, "", "block_size");
    if (const json* parent = optional_field(root, "parent")) {
      const json& pj = object_at(*parent, "parent");
      m.parent = parent_ref{string_of(pj, "parent", "image_id"),
                            hex16_at(field(pj, "parent", "manifest_checksum"), "parent.manifest_checksum"),
                            string_of(pj, "parent", "path")};
    }
  }
  if (m.format >= 4)
    if (const json* vmm = optional_field(root, "vmm")) m.vmm = vmm_layout_from_json(*vmm, "vmm");
  // Optional: absent in a complete image, and in every image of tools older than the field.
  if (optional_field(root, "lacking") != nullptr) {
    for_each_object(root, "", "lacking", [&](const json& l, const std::string& p) {
      m.lacking.push_back({string_of(l, p, "kind"), u64_of(l, p, "bytes")});
    });
  }
  m.ipc_imports = ipc_imports_from_json(root);
  if (how == tables::apart) {
    const json& t = object_of(root, "", "tables");
    out.tables_bytes = u64_of(t, "tables", "bytes");
    out.tables_checksum = hex16_at(field(t, "tables", "checksum"), "tables.checksum");
  }
  return out;
}

// Everything before the pools' tables, and after them, in file order.
ojson encode_head(const manifest& m) {
  ojson j;
  j["magic"] = "vmmckpt-image";
  j["format"] = m.format;
  if (m.format >= 3) j["image_id"] = m.image_id;
  j["tool_version"] = m.tool_version;
  j["created"] = m.created;
  j["host"] = m.host;
  j["pid"] = m.pid;
  j["command"] = m.command;
  j["devices"] = encode_devices(m.devices);
  return j;
}

ojson encode_pool_head(const pool& p) {
  ojson pj;
  if (p.kind == pool_kind::vmm) pj["kind"] = "vmm";
  pj["device"] = p.device;
  pj["base"] = hex(p.base);
  pj["size"] = p.size;
  pj["granularity"] = p.granularity;
  return pj;
}

void encode_tail(const manifest& m, ojson& j) {
  j["data_bytes"] = m.data_bytes;
  if (m.format >= 2) j["data_files"] = m.data_files;
  j["hold_us"] = m.hold_us;
  if (m.format >= 5) {
    j["block_size"] = m.block_size;
    if (m.parent) {
      ojson pj;
      pj["image_id"] = m.parent->image_id;
      pj["manifest_checksum"] = hex16(m.parent->manifest_checksum);
      pj["path"] = m.parent->path;
      j["parent"] = std::move(pj);
    }
  }
  if (m.vmm) j["vmm"] = to_json(*m.vmm);
  if (!m.ipc_imports.empty()) j["ipc_imports"] = to_json(m.ipc_imports);
  if (m.lacking.empty()) return;
  j["lacking"] = ojson::array();
  for (const auto& l : m.lacking) {
    ojson lj;
    lj["kind"] = l.kind;
    lj["bytes"] = l.bytes;
    j["lacking"].push_back(std::move(lj));
  }
}

// A command line or host name need not be UTF-8: replace bad bytes rather than fail the dump.
std::string dump(const ojson& j, int indent) { return j.dump(indent, ' ', false, ojson::error_handler_t::replace); }

}  // namespace

std::string to_json(const manifest& m, int indent) {
  ojson j = encode_head(m);
  j["pools"] = ojson::array();
  for (const auto& p : m.pools) {
    ojson pj = encode_pool_head(p);
    pj["allocations"] = ojson::array();
    for (const auto& a : p.allocations) {
      ojson aj;
      aj["addr"] = hex(a.addr);
      aj["size"] = a.size;
      aj["api"] = name_of(a.api);
      pj["allocations"].push_back(std::move(aj));
    }
    pj["extents"] = ojson::array();
    for (const auto& e : p.extents) {
      ojson ej;
      ej["addr"] = hex(e.addr);
      ej["size"] = e.size;
      if (m.format >= 3) ej["stored"] = e.stored;
      if (m.format >= 2) ej["file"] = e.file;
      ej["offset"] = e.offset;
      ej["checksum"] = hex16(e.checksum);
      if (m.format >= 5) {
        ej["blocks"] = ojson::array();
        for (const auto& b : e.blocks) {
          ojson bj;
          bj["checksum"] = hex16(b.checksum);
          if (b.in_parent) bj["in_parent"] = true;
          if (b.zero) bj["zero"] = true;
          ej["blocks"].push_back(std::move(bj));
        }
      }
      pj["extents"].push_back(std::move(ej));
    }
    j["pools"].push_back(std::move(pj));
  }
  encode_tail(m, j);
  return dump(j, indent);
}

manifest from_json(const std::string& text) {
  try {
    return decode(parse_limited(text, detail::max_json_depth), tables::inline_).m;
  } catch (const decode_error& e) {
    fail(e.what());
  }
}

namespace detail {

std::string encode_manifest_file(const manifest& m, std::uint64_t tables_bytes, std::uint64_t tables_checksum) {
  ojson j = encode_head(m);
  j["pools"] = ojson::array();
  for (const auto& p : m.pools) {
    ojson pj = encode_pool_head(p);
    pj["allocation_count"] = p.allocations.size();
    pj["extent_count"] = p.extents.size();
    j["pools"].push_back(std::move(pj));
  }
  encode_tail(m, j);
  ojson t;
  t["bytes"] = tables_bytes;
  t["checksum"] = hex16(tables_checksum);
  j["tables"] = std::move(t);
  return dump(j, 2) + "\n";
}

manifest_file decode_manifest_file(const std::string& text) {
  try {
    const json root = parse_limited(text, max_json_depth);
    return decode(root, decode_format(root) >= 3 ? tables::apart : tables::inline_);
  } catch (const decode_error& e) {
    fail(e.what());
  }
}

}  // namespace detail
}  // namespace vmmckpt::image
