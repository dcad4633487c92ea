// The manifest as JSON (encode, strict decode of hostile input) and the validation rules of an image.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "image_detail.hpp"
#include "vmmckpt/image.hpp"

namespace vmmckpt::image {
namespace detail {

[[noreturn]] void fail(std::string message) { throw image_error(std::move(message)); }

background_hasher::background_hasher() : thread_([this] { run(); }) {}

background_hasher::~background_hasher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void background_hasher::start(XXH3_state_t* state, const void* p, std::size_t n) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  state_ = state;
  p_ = p;
  n_ = n;
  busy_ = true;
  lock.unlock();
  cv_.notify_all();
}

void background_hasher::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
}

void background_hasher::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return busy_ || stop_; });
    if (busy_) {
      lock.unlock();
      checksum_update(state_, p_, n_);
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    } else if (stop_) {
      return;
    }
  }
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  return ::strerror_r(err, buf, sizeof buf);
}

std::string hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  char buf[19];
  char* p = buf + sizeof buf;
  do {
    *--p = digits[v & 0xf];
    v >>= 4;
  } while (v != 0);
  *--p = 'x';
  *--p = '0';
  return std::string(p, buf + sizeof buf);
}

std::string extent_name(std::size_t pool, std::size_t index) {
  return "pools[" + std::to_string(pool) + "].extents[" + std::to_string(index) + "]";
}

std::string data_file_name(std::uint32_t file) {
  return file == 0 ? std::string(data_name) : "data." + std::to_string(file) + ".bin";
}

namespace {
void put_le(header_bytes& h, std::size_t at, std::uint64_t v, int bytes) {
  // Little-endian whatever the host: the file must read the same on every machine.
  for (int i = 0; i < bytes; ++i) h[at + i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t get_le(const header_bytes& h, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(h[at + i]) << (8 * i);
  return v;
}
}  // namespace

header_bytes encode_data_header(std::uint64_t payload_bytes, std::uint64_t manifest_checksum, std::uint32_t file,
                                std::uint32_t files) {
  header_bytes h{};
  std::memcpy(h.data(), data_magic.data(), data_magic.size());
  put_le(h, 12, data_version, 4);
  put_le(h, 16, payload_bytes, 8);
  put_le(h, 24, manifest_checksum, 8);
  put_le(h, 32, file, 4);
  put_le(h, 36, files, 4);
  return h;
}

std::uint64_t header_manifest_checksum(const header_bytes& h) { return get_le(h, 24, 8); }

std::string check_data_header(const header_bytes& h, std::uint64_t expected_payload, std::uint32_t format,
                              std::uint32_t file, std::uint32_t files) {
  if (std::memcmp(h.data(), data_magic.data(), data_magic.size()) != 0)
    return "bad magic (not a vmmckpt data file)";
  const auto version = static_cast<std::uint32_t>(get_le(h, 12, 4));
  if (version > data_version)
    return "format " + std::to_string(version) + " is newer than this tool understands (" +
           std::to_string(data_version) + ")";
  if (version != format)
    return "format " + std::to_string(version) + " does not match the manifest's format " + std::to_string(format);
  const std::uint64_t payload = get_le(h, 16, 8);
  if (payload != expected_payload)
    return "header gives a payload of " + std::to_string(payload) + " bytes but the manifest's extents in this file hold " +
           std::to_string(expected_payload);
  std::size_t reserved_from = 32;
  if (version >= 2) {
    if (get_le(h, 32, 4) != file || get_le(h, 36, 4) != files)
      return "header says it is data file " + std::to_string(get_le(h, 32, 4)) + " of " + std::to_string(get_le(h, 36, 4)) +
             ", expected " + std::to_string(file) + " of " + std::to_string(files);
    reserved_from = 40;
  }
  for (std::size_t i = reserved_from; i < h.size(); ++i)
    if (h[i] != 0) return "reserved header byte " + std::to_string(i) + " is not zero";
  return {};
}

}  // namespace detail

namespace {

using detail::fail;
using detail::hex;
// Decoding uses std::map objects: ordered_json's linear key lookup would let a hostile object
// with millions of keys make parsing quadratic. Encoding uses ordered_json for a stable field order.
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string checksum_text(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
  return s;
}

std::string join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }
std::string index(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

const json& field(const json& obj, const std::string& path, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path.empty() ? "missing field '" + std::string(key) + "'"
                                         : path + ": missing field '" + key + "'");
  return *it;
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

std::string string_at(const json& v, const std::string& path) {
  if (!v.is_string()) fail(path + ": expected a string");
  return v.get<std::string>();
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Parses 1 to 16 hex digits; false on anything else (so no value can overflow).
bool parse_hex(std::string_view s, std::uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    const int d = hex_digit(c);
    if (d < 0) return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  out = v;
  return true;
}

std::uint64_t addr_at(const json& v, const std::string& path) {
  std::uint64_t out = 0;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && parse_hex(std::string_view(s).substr(2), out))
      return out;
  }
  fail(path + ": expected an address as a \"0x\" hex string of at most 16 digits");
}

std::uint64_t checksum_at(const json& v, const std::string& path) {
  std::uint64_t out = 0;
  if (v.is_string() && v.get_ref<const std::string&>().size() == 16 && parse_hex(v.get_ref<const std::string&>(), out))
    return out;
  fail(path + ": expected a checksum as a string of 16 hex digits");
}

json parse_limited(const std::string& text) {
  // Deep nesting is refused early: nothing legitimate needs it and it costs memory and time.
  const json::parser_callback_t limit_depth = [](int depth, json::parse_event_t, json&) {
    if (static_cast<std::size_t>(depth) > detail::max_json_depth)
      fail("JSON nested deeper than " + std::to_string(detail::max_json_depth) + " levels");
    return true;
  };
  try {
    return json::parse(text, limit_depth);
  } catch (const json::exception& e) {
    // The parser quotes the bytes it stopped at, which may be broken UTF-8: escaped, the message
    // stays printable and can go into JSON output (cuda-ckpt verify --json).
    std::string why = "not valid JSON: ";
    for (const char* c = e.what(); *c != '\0'; ++c) {
      const auto b = static_cast<unsigned char>(*c);
      if (b >= 0x20 && b < 0x7f) {
        why += *c;
      } else {
        static constexpr char digits[] = "0123456789abcdef";
        why += {'\\', 'x', digits[b >> 4], digits[b & 0xf]};
      }
    }
    fail(std::move(why));
  }
}

// Decodes fields in the order to_json writes them, so the first defect reported is the first in the file.
manifest decode(const json& root) {
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
  if (format.get<std::int64_t>() != 1 && format.get<std::int64_t>() != format_version)
    fail("format " + std::to_string(format.get<std::int64_t>()) + " is not a known format (this tool understands 1 to " +
         std::to_string(format_version) + ")");

  manifest m;
  m.format = static_cast<std::uint32_t>(format.get<std::int64_t>());
  const bool multi_file = m.format >= 2;  // format 1: one data file, extents without `file`
  m.tool_version = string_at(field(root, "", "tool_version"), "tool_version");
  m.created = string_at(field(root, "", "created"), "created");
  m.host = string_at(field(root, "", "host"), "host");
  m.pid = i64_at(field(root, "", "pid"), "pid");

  const json& command = array_at(field(root, "", "command"), "command");
  m.command.reserve(command.size());
  for (std::size_t i = 0; i < command.size(); ++i) m.command.push_back(string_at(command[i], index("command", i)));

  const json& devices = array_at(field(root, "", "devices"), "devices");
  m.devices.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const std::string p = index("devices", i);
    const json& d = object_at(devices[i], p);
    device_info info;
    info.ordinal = int_at(field(d, p, "ordinal"), join(p, "ordinal"));
    info.name = string_at(field(d, p, "name"), join(p, "name"));
    info.uuid = string_at(field(d, p, "uuid"), join(p, "uuid"));
    info.cc_major = int_at(field(d, p, "cc_major"), join(p, "cc_major"));
    info.cc_minor = int_at(field(d, p, "cc_minor"), join(p, "cc_minor"));
    m.devices.push_back(std::move(info));
  }

  const json& pools = array_at(field(root, "", "pools"), "pools");
  m.pools.reserve(pools.size());
  for (std::size_t i = 0; i < pools.size(); ++i) {
    const std::string p = index("pools", i);
    const json& pj = object_at(pools[i], p);
    pool pl;
    pl.device = int_at(field(pj, p, "device"), join(p, "device"));
    pl.base = addr_at(field(pj, p, "base"), join(p, "base"));
    pl.size = u64_at(field(pj, p, "size"), join(p, "size"));
    pl.granularity = u64_at(field(pj, p, "granularity"), join(p, "granularity"));
    const std::string ap = join(p, "allocations");
    const json& allocs = array_at(field(pj, p, "allocations"), ap);
    pl.allocations.reserve(allocs.size());
    for (std::size_t k = 0; k < allocs.size(); ++k) {
      const std::string q = index(ap, k);
      const json& a = object_at(allocs[k], q);
      allocation al;
      al.addr = addr_at(field(a, q, "addr"), join(q, "addr"));
      al.size = u64_at(field(a, q, "size"), join(q, "size"));
      al.api = string_at(field(a, q, "api"), join(q, "api"));
      pl.allocations.push_back(std::move(al));
    }
    const std::string ep = join(p, "extents");
    const json& exts = array_at(field(pj, p, "extents"), ep);
    pl.extents.reserve(exts.size());
    for (std::size_t k = 0; k < exts.size(); ++k) {
      const std::string q = index(ep, k);
      const json& e = object_at(exts[k], q);
      extent ex;
      ex.addr = addr_at(field(e, q, "addr"), join(q, "addr"));
      ex.size = u64_at(field(e, q, "size"), join(q, "size"));
      if (multi_file) ex.file = u32_at(field(e, q, "file"), join(q, "file"));
      ex.offset = u64_at(field(e, q, "offset"), join(q, "offset"));
      ex.checksum = checksum_at(field(e, q, "checksum"), join(q, "checksum"));
      pl.extents.push_back(ex);
    }
    m.pools.push_back(std::move(pl));
  }
  m.data_bytes = u64_at(field(root, "", "data_bytes"), "data_bytes");
  if (multi_file) m.data_files = u32_at(field(root, "", "data_files"), "data_files");
  m.hold_us = u64_at(field(root, "", "hold_us"), "hold_us");
  return m;
}

// [addr, addr + size) lies inside [lo, end); never overflows.
bool inside(std::uint64_t addr, std::uint64_t size, std::uint64_t lo, std::uint64_t end) {
  return addr >= lo && addr <= end && size <= end - addr;
}

std::string range_text(std::uint64_t addr, std::uint64_t size) {
  return hex(addr) + "+" + std::to_string(size);
}

}  // namespace

std::string to_json(const manifest& m, int indent) {
  ojson j;
  j["magic"] = "vmmckpt-image";
  j["format"] = m.format;
  j["tool_version"] = m.tool_version;
  j["created"] = m.created;
  j["host"] = m.host;
  j["pid"] = m.pid;
  j["command"] = m.command;
  j["devices"] = ojson::array();
  for (const auto& d : m.devices) {
    ojson dj;
    dj["ordinal"] = d.ordinal;
    dj["name"] = d.name;
    dj["uuid"] = d.uuid;
    dj["cc_major"] = d.cc_major;
    dj["cc_minor"] = d.cc_minor;
    j["devices"].push_back(std::move(dj));
  }
  j["pools"] = ojson::array();
  for (const auto& p : m.pools) {
    ojson pj;
    pj["device"] = p.device;
    pj["base"] = hex(p.base);
    pj["size"] = p.size;
    pj["granularity"] = p.granularity;
    pj["allocations"] = ojson::array();
    for (const auto& a : p.allocations) {
      ojson aj;
      aj["addr"] = hex(a.addr);
      aj["size"] = a.size;
      aj["api"] = a.api;
      pj["allocations"].push_back(std::move(aj));
    }
    pj["extents"] = ojson::array();
    for (const auto& e : p.extents) {
      ojson ej;
      ej["addr"] = hex(e.addr);
      ej["size"] = e.size;
      if (m.format >= 2) ej["file"] = e.file;
      ej["offset"] = e.offset;
      ej["checksum"] = checksum_text(e.checksum);
      pj["extents"].push_back(std::move(ej));
    }
    j["pools"].push_back(std::move(pj));
  }
  j["data_bytes"] = m.data_bytes;
  if (m.format >= 2) j["data_files"] = m.data_files;
  j["hold_us"] = m.hold_us;
  // A command line or host name need not be UTF-8: replace bad bytes rather than fail the dump.
  return j.dump(indent, ' ', false, ojson::error_handler_t::replace);
}

manifest from_json(const std::string& text) { return decode(parse_limited(text)); }

void validate(const manifest& m) {
  if (m.format > format_version)
    fail("format " + std::to_string(m.format) + " is newer than this tool understands (" +
         std::to_string(format_version) + ")");
  if (m.format != 1 && m.format != format_version) fail("format " + std::to_string(m.format) + " is not a known format");
  if (m.data_files == 0 || m.data_files > max_data_files)
    fail("data_files is " + std::to_string(m.data_files) + ", expected 1 to " + std::to_string(max_data_files));
  if (m.format == 1 && m.data_files != 1) fail("data_files is " + std::to_string(m.data_files) + " in a format 1 image");
  if (m.pid <= 0 || m.pid > INT_MAX) fail("pid " + std::to_string(m.pid) + " is not a valid process id");

  // Ordinals are bounded, so the device and pool lists are too, and the pairwise checks stay cheap.
  constexpr int max_devices = 1024;
  std::vector<int> device_index(max_devices, -1);
  for (std::size_t i = 0; i < m.devices.size(); ++i) {
    const auto& d = m.devices[i];
    const std::string p = "devices[" + std::to_string(i) + "]";
    if (d.ordinal < 0 || d.ordinal >= max_devices)
      fail(p + ".ordinal " + std::to_string(d.ordinal) + " is out of range (0.." + std::to_string(max_devices - 1) + ")");
    if (device_index[d.ordinal] >= 0)
      fail(p + ".ordinal " + std::to_string(d.ordinal) + " repeats devices[" + std::to_string(device_index[d.ordinal]) + "]");
    device_index[d.ordinal] = static_cast<int>(i);
    if (d.cc_major < 0 || d.cc_minor < 0) fail(p + ": negative compute capability");
  }

  std::vector<int> pool_of_device(max_devices, -1);
  // Each data file holds its extents back to back, in manifest order.
  std::vector<std::uint64_t> file_end(m.data_files, 0);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < m.pools.size(); ++i) {
    const pool& pl = m.pools[i];
    const std::string p = "pools[" + std::to_string(i) + "]";
    if (pl.device < 0 || pl.device >= max_devices || device_index[pl.device] < 0)
      fail(p + ".device " + std::to_string(pl.device) + " is not listed in devices");
    if (pool_of_device[pl.device] >= 0)
      fail(p + ".device " + std::to_string(pl.device) + " already has pools[" + std::to_string(pool_of_device[pl.device]) + "]");
    pool_of_device[pl.device] = static_cast<int>(i);
    if (pl.base == 0) fail(p + ".base is zero");
    if (pl.size == 0) fail(p + ".size is zero");
    if (pl.granularity == 0) fail(p + ".granularity is zero");
    if (pl.base % pl.granularity != 0)
      fail(p + ".base " + hex(pl.base) + " is not a multiple of the granularity " + std::to_string(pl.granularity));
    if (pl.size % pl.granularity != 0)
      fail(p + ".size " + std::to_string(pl.size) + " is not a multiple of the granularity " + std::to_string(pl.granularity));
    if (pl.base > std::numeric_limits<std::uint64_t>::max() - pl.size)
      fail(p + ": base " + hex(pl.base) + " + size " + std::to_string(pl.size) + " overflows the address space");
    const std::uint64_t end = pl.base + pl.size;
    for (std::size_t k = 0; k < i; ++k) {
      const pool& q = m.pools[k];
      if (pl.base < q.base + q.size && q.base < end) fail(p + " overlaps pools[" + std::to_string(k) + "]");
    }

    for (std::size_t k = 0; k < pl.allocations.size(); ++k) {
      const allocation& a = pl.allocations[k];
      const std::string q = p + ".allocations[" + std::to_string(k) + "]";
      if (a.size == 0) fail(q + " has size zero");
      if (!inside(a.addr, a.size, pl.base, end))
        fail(q + " (" + range_text(a.addr, a.size) + ") is outside the pool (" + range_text(pl.base, pl.size) + ")");
      if (k > 0) {
        const allocation& prev = pl.allocations[k - 1];
        if (a.addr < prev.addr)
          fail(q + " at " + hex(a.addr) + " is out of order (below allocations[" + std::to_string(k - 1) + "] at " +
               hex(prev.addr) + ")");
        if (a.addr < prev.addr + prev.size) fail(q + " overlaps allocations[" + std::to_string(k - 1) + "]");
      }
    }

    std::size_t alloc = 0;  // the last allocation starting at or below the current extent
    for (std::size_t k = 0; k < pl.extents.size(); ++k) {
      const extent& e = pl.extents[k];
      const std::string q = detail::extent_name(i, k);
      if (e.size == 0) fail(q + " is empty");
      if (!inside(e.addr, e.size, pl.base, end))
        fail(q + " (" + range_text(e.addr, e.size) + ") is outside the pool (" + range_text(pl.base, pl.size) + ")");
      if (k > 0) {
        const extent& prev = pl.extents[k - 1];
        if (e.addr < prev.addr)
          fail(q + " at " + hex(e.addr) + " is out of order (below extents[" + std::to_string(k - 1) + "] at " +
               hex(prev.addr) + ")");
        if (e.addr < prev.addr + prev.size) fail(q + " overlaps extents[" + std::to_string(k - 1) + "]");
      }
      while (alloc + 1 < pl.allocations.size() && pl.allocations[alloc + 1].addr <= e.addr) ++alloc;
      // Allocations are sorted and disjoint by now, so only this one can hold the extent.
      if (pl.allocations.empty() || pl.allocations[alloc].addr > e.addr ||
          e.addr - pl.allocations[alloc].addr >= pl.allocations[alloc].size)
        fail(q + " (" + range_text(e.addr, e.size) + ") is not inside any allocation");
      const allocation& a = pl.allocations[alloc];
      if (!inside(e.addr, e.size, a.addr, a.addr + a.size))
        fail(q + " (" + range_text(e.addr, e.size) + ") is not inside one allocation (allocations[" +
             std::to_string(alloc) + "] is " + range_text(a.addr, a.size) + ")");
      if (e.file >= m.data_files)
        fail(q + ".file is " + std::to_string(e.file) + " but the image has " + std::to_string(m.data_files) + " data files");
      std::uint64_t& offset = file_end[e.file];
      if (e.offset != offset)
        fail(q + ".offset is " + std::to_string(e.offset) + ", expected " + std::to_string(offset) +
             " (each data file holds its extents back to back, in manifest order)");
      if (e.size > std::numeric_limits<std::uint64_t>::max() - detail::data_header_size - offset)
        fail(q + ": data offsets overflow");
      offset += e.size;
      if (e.size > std::numeric_limits<std::uint64_t>::max() - total) fail(q + ": data_bytes overflows");
      total += e.size;
    }
  }
  if (m.data_bytes != total)
    fail("data_bytes is " + std::to_string(m.data_bytes) + " but the extents hold " + std::to_string(total) + " bytes");
  if (m.data_bytes > std::numeric_limits<std::uint64_t>::max() - detail::data_header_size)
    fail("data_bytes " + std::to_string(m.data_bytes) + " is too large");
}

}  // namespace vmmckpt::image
