// Unit tests of program-made VMM memory in images: the layout's rules, its JSON, and the registry's
// snapshot and rebuild of it.
#include <catch2/catch.hpp>

#include <functional>

#include "vmmckpt/image/image.hpp"
#include "vmmckpt/pool/vmm_registry.hpp"

using namespace vmmckpt;
namespace img = vmmckpt::image;
using Catch::Matchers::Contains;

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t base = default_vmm_base;
constexpr std::uint64_t token1 = vmm_token_tag | 1, token2 = vmm_token_tag | 2;

vmm_handle handle(std::uint64_t token, std::uint64_t size, std::uint32_t refs) {
  vmm_handle h;
  h.token = token;
  h.size = size;
  h.refs = refs;
  h.properties.bytes[0] = 1;
  return h;
}

// Two reservations (the second never mapped, as vLLM's sleep leaves one), two handles, the second
// mapped from an offset, access over both mappings in one range.
vmm_layout sample_layout() {
  vmm_layout l;
  l.next_token = 3;
  l.reservations = {{base, 64 * MiB, 0}, {base + 64 * MiB, 32 * MiB, 0}};
  l.handles = {handle(token1, 8 * MiB, 2), handle(token2, 16 * MiB, 1)};
  l.mappings = {{base, 8 * MiB, token1, 0}, {base + 8 * MiB, 8 * MiB, token2, 8 * MiB}};
  l.access = {{base, 16 * MiB, {{1, 0, 3}}}};
  return l;
}

// An image manifest holding the sample layout, its bytes as one extent per mapping.
img::manifest sample_manifest() {
  img::manifest m;
  m.format = 4;  // extents without blocks, built by hand
  m.block_size = 0;
  m.image_id = std::string(32, 'a');
  m.tool_version = "test";
  m.pid = 42;
  m.devices = {{0, "GPU", "GPU-0", 9, 0}};
  img::pool p;
  p.kind = img::pool_kind::vmm;
  p.base = base;
  p.size = default_vmm_window;
  p.granularity = 2 * MiB;
  m.vmm = sample_layout();
  for (const auto& x : m.vmm->mappings) {
    p.allocations.push_back({x.addr, x.size, alloc_api::cu_mem_map});
    p.extents.push_back({x.addr, x.size, x.size, 0, m.data_bytes, 0, {}});
    m.data_bytes += x.size;
  }
  m.pools = {p};
  return m;
}

std::string refusal(const std::function<void(img::manifest&)>& spoil) {
  img::manifest m = sample_manifest();
  spoil(m);
  try {
    img::validate(m);
  } catch (const img::image_error& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("vmm image: a manifest with program-made VMM memory is valid and round-trips through JSON", "[image][vmm]") {
  const img::manifest m = sample_manifest();
  REQUIRE_NOTHROW(img::validate(m));
  CHECK(check(*m.vmm, "vmm").empty());
  const img::manifest again = img::from_json(img::to_json(m));
  CHECK(again == m);
  CHECK(again.pools[0].kind == img::pool_kind::vmm);
  // Format 3 readers never see the layout: it is a format 4 image.
  CHECK(m.format == 4);
}

TEST_CASE("vmm image: the layout's rules refuse what a restore could not rebuild", "[image][vmm]") {
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->mappings[1].token = vmm_token_tag | 9; }),
             Contains("is not a token this layout handed out") || Contains("names no handle"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->mappings[1].offset = 12 * MiB; }),
             Contains("vmm.mappings[1] reaches past the end of its handle"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->reservations[0].size = 4 * MiB; }),
             Contains("vmm.mappings[0] (0x300000000000+8388608) is not inside one reservation"));
  CHECK_THAT(refusal([](img::manifest& m) {
               m.vmm->handles[1].refs = 0, m.vmm->mappings.pop_back(), m.pools[0].allocations.pop_back(),
               m.pools[0].extents.pop_back(), m.data_bytes -= 8 * MiB, m.vmm->access[0].size = 8 * MiB;
             }),
             Contains("vmm.handles[1] has neither a reference nor a mapping"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->access[0].size = 32 * MiB; }),
             Contains("vmm.access[0] (0x300000000000+33554432) is not wholly mapped"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->reservations[1].addr = base + 32 * MiB; }),
             Contains("vmm.reservations[1] overlaps"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->reservations[0].device = 1; }), Contains("vmm.reservations[0]"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->handles[0].token = 7; }), Contains("vmm.handles[0].token 0x7"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm->next_token = 2; }),
             Contains("vmm.handles[1].token 0x766d6d0000000002 is not a token this layout handed out"));
  CHECK_THAT(refusal([](img::manifest& m) { m.pools[0].size /= 2; }),
             Contains("pools[0] (0x300000000000+1099511627776) is not device 0's VMM window"));
  CHECK_THAT(refusal([](img::manifest& m) { m.pools[0].allocations[0].api = alloc_api::cuda_malloc; }),
             Contains("pools[0].allocations[0].api cudaMalloc is not a VMM mapping, in a pool of kind vmm"));
  CHECK_THAT(refusal([](img::manifest& m) { m.vmm.reset(); }),
             Contains("pools[0] is of kind vmm, but the image has no vmm layout"));
  CHECK_THAT(refusal([](img::manifest& m) {
               m.vmm->mappings.push_back({base + 16 * MiB, 2 * MiB, token2, 0});
             }),
             Contains("vmm.mappings has 3 entries but the pools of kind vmm store 2"));
  CHECK_THAT(refusal([](img::manifest& m) { m.format = 3; }), Contains("a vmm layout in a format 3 image"));
}

TEST_CASE("vmm image: a layout's JSON is read strictly", "[image][vmm]") {
  auto j = nlohmann::json::parse(to_json(sample_layout()).dump());
  CHECK(vmm_layout_from_json(j, "vmm") == sample_layout());
  j["handles"][0]["properties"] = "zz";
  CHECK_THROWS_WITH(vmm_layout_from_json(j, "vmm"), Contains("vmm.handles[0].properties: expected 128 hex digits"));
  j = nlohmann::json::parse(to_json(sample_layout()).dump());
  j["mappings"][0].erase("offset");
  CHECK_THROWS_WITH(vmm_layout_from_json(j, "vmm"), Contains("vmm.mappings[0]: missing field 'offset'"));
}

TEST_CASE("vmm registry: its layout is what a new process's registry takes back, tokens and counter included",
          "[vmm]") {
  vmm_registry r(base, default_vmm_window);
  std::uint64_t a = 0, sleeping = 0;
  REQUIRE(r.reserve(0, 64 * MiB, 0, 0, a) == vmm_status::ok);
  REQUIRE(r.reserve(0, 32 * MiB, 0, 0, sleeping) == vmm_status::ok);
  vmm_properties p;
  p.bytes[0] = 1;
  const std::uint64_t t1 = r.add_handle(1001, 8 * MiB, 0, 0, p), t2 = r.add_handle(1002, 16 * MiB, 0, 4, p);
  const std::uint64_t t3 = r.add_handle(1003, 2 * MiB, 0, 0, p);  // created, never mapped
  REQUIRE(r.map(a, 8 * MiB, 0, t1) == vmm_status::ok);
  REQUIRE(r.map(a + 8 * MiB, 8 * MiB, 8 * MiB, t2) == vmm_status::ok);
  const vmm_access rw{1, 0, 3};
  r.set_access(a, 16 * MiB, std::span(&rw, 1));
  std::uint64_t again = 0;
  REQUIRE(r.retain_at(a + MiB, again) == vmm_status::ok);
  CHECK(r.unmapped_handle_bytes() == 2 * MiB + 8 * MiB);  // t3 whole, and the first half of t2

  const vmm_layout l = r.layout();
  CHECK(check(l, "vmm").empty());
  CHECK(l.next_token == 4);
  CHECK(l.handles[0].refs == 2);
  CHECK(l.handles[0].real == 0);  // the driver's handles are never part of it

  // Suspend: the driver's handles go, the records stay.
  const auto taken = r.take_real();
  CHECK(taken == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{t1, 1001}, {t2, 1002}, {t3, 1003}});
  CHECK(r.live_handle(t1)->real == 0);
  CHECK(r.layout() == l);
  REQUIRE(r.replace_real(t1, 2001));

  // A new process takes the layout; its next token follows the image's.
  vmm_registry fresh(base, default_vmm_window);
  REQUIRE(fresh.load(l));
  CHECK(fresh.layout() == l);
  CHECK_FALSE(fresh.load(l));  // only an empty registry takes a layout
  CHECK(fresh.add_handle(5000, 2 * MiB, 0, 0, p) == (vmm_token_tag | 4));
  std::uint64_t token = 0;
  REQUIRE(fresh.retain_at(a + 9 * MiB, token) == vmm_status::ok);
  CHECK(token == t2);
  std::vector<std::uint64_t> released;
  REQUIRE(fresh.release(t2, released) == vmm_status::ok);  // the retain just taken
  REQUIRE(fresh.release(t2, released) == vmm_status::ok);  // the image's reference
  CHECK(released.empty());                                 // still mapped
  fresh.unmap(a + 8 * MiB, 8 * MiB, released);
  CHECK(released.size() == 1);  // now it goes
  vmm_registry elsewhere(base + default_vmm_window * 8, default_vmm_window);
  CHECK_FALSE(elsewhere.load(l));  // other windows
}

TEST_CASE("vmm registry: the layout gives access rights over owned mappings only", "[vmm]") {
  vmm_registry r(base, default_vmm_window);
  std::uint64_t a = 0;
  REQUIRE(r.reserve(0, 8 * MiB, 0, 0, a) == vmm_status::ok);
  vmm_properties p;
  const std::uint64_t owned = r.add_handle(1001, 4 * MiB, 0, 0, p);
  r.add_not_owned(0x7f0000001000, vmm_not_owned_kind::host, 4 * MiB);  // a host-located handle, passed through
  REQUIRE(r.map(a, 4 * MiB, 0, owned) == vmm_status::ok);
  REQUIRE(r.map(a + 4 * MiB, 4 * MiB, 0, 0x7f0000001000) == vmm_status::ok);
  const vmm_access rw{1, 0, 3};
  r.set_access(a, 8 * MiB, std::span(&rw, 1));  // over both, in one call
  const vmm_layout l = r.layout();
  REQUIRE(l.access.size() == 1);
  CHECK(l.access[0].addr == a);
  CHECK(l.access[0].size == 4 * MiB);
  CHECK(check(l, "vmm").empty());
}

TEST_CASE("vmm image: access rights must list each location once, in order", "[image][vmm]") {
  CHECK_THAT(refusal([](img::manifest& m) {
               m.vmm->access[0].access = {{1, 1, 3}, {1, 0, 3}};
             }),
             Contains("vmm.access[0].rights[1] is out of order or repeats a location"));
  CHECK_THAT(refusal([](img::manifest& m) {
               m.vmm->access[0].access = {{1, 0, 3}, {1, 0, 1}};
             }),
             Contains("vmm.access[0].rights[1] is out of order or repeats a location"));
}

namespace {
// An import of another process's handle mapped in the sample's second reservation.
vmm_import sample_import() {
  vmm_import x;
  x.addr = base + 64 * MiB;
  x.size = 4 * MiB;
  x.offset = 2 * MiB;
  x.exporter_pid = 4243;
  x.exporter_start = 99;
  x.token = vmm_token_tag | 7;
  x.handle_size = 8 * MiB;
  x.device_uuid = "GPU-1";
  return x;
}
}  // namespace

TEST_CASE("vmm image: imports of other processes' handles are checked and round-trip, access over them included",
          "[image][vmm]") {
  img::manifest m = sample_manifest();
  m.vmm->imports = {sample_import()};
  m.vmm->access.push_back({base + 64 * MiB, 4 * MiB, {{1, 0, 3}, {3, 0, 3}}});
  REQUIRE_NOTHROW(img::validate(m));
  CHECK(img::from_json(img::to_json(m)) == m);
  // A layout without imports writes no field, as images before them.
  CHECK_FALSE(to_json(sample_layout()).contains("imports"));

  auto spoiled = [&](const std::function<void(vmm_layout&)>& spoil) {
    vmm_layout l = *m.vmm;
    spoil(l);
    return check(l, "vmm");
  };
  CHECK_THAT(spoiled([](vmm_layout& l) { l.imports[0].addr = base + 96 * MiB; }),
             Contains("vmm.imports[0] (0x300006000000+4194304) is not inside one reservation"));
  CHECK_THAT(spoiled([](vmm_layout& l) { l.imports[0].addr = base; }), Contains("vmm.imports[0] overlaps a mapping"));
  CHECK_THAT(spoiled([](vmm_layout& l) { l.imports[0].offset = 6 * MiB; }),
             Contains("vmm.imports[0] reaches past the end of the exporter's handle"));
  CHECK_THAT(spoiled([](vmm_layout& l) { l.imports[0].token = 7; }), Contains("vmm.imports[0].token 0x7"));
  CHECK_THAT(spoiled([](vmm_layout& l) { l.imports[0].exporter_pid = 0; }), Contains("vmm.imports[0].exporter_pid 0"));
  CHECK_THAT(spoiled([](vmm_layout& l) { l.imports.clear(); }),
             Contains("vmm.access[1] (0x300004000000+4194304) is not wholly mapped"));
}

TEST_CASE("vmm registry: an identified import is in the layout and not lacking; an unidentified one is lacking",
          "[vmm]") {
  vmm_registry r(base, default_vmm_window);
  std::uint64_t a = 0, b = 0;
  REQUIRE(r.reserve(0, 4 * MiB, 0, 0, a) == vmm_status::ok);
  REQUIRE(r.reserve(0, 2 * MiB, 0, 0, b) == vmm_status::ok);
  vmm_import origin = sample_import();
  origin.addr = origin.size = origin.offset = 0;
  const std::uint64_t token = r.add_import(0x7f00000a0000, origin);
  CHECK(looks_like_import_token(token));  // the program holds this, not the driver's handle
  CHECK(r.driver_value(token) == 0x7f00000a0000);
  r.add_not_owned(0x7f00000b0000, vmm_not_owned_kind::imported, 0);  // its exporter did not say
  REQUIRE(r.map(a, 4 * MiB, 2 * MiB, token) == vmm_status::ok);
  REQUIRE(r.map(b, 2 * MiB, 0, 0x7f00000b0000) == vmm_status::ok);
  const vmm_access rw{1, 0, 3};
  r.set_access(a, 6 * MiB, std::span(&rw, 1));
  CHECK(r.not_owned_bytes().imported == 2 * MiB);  // the unidentified one only

  const vmm_layout l = r.layout();
  REQUIRE(l.imports.size() == 1);
  CHECK(l.imports[0].addr == a);
  CHECK(l.imports[0].size == 4 * MiB);
  CHECK(l.imports[0].offset == 2 * MiB);
  CHECK(l.imports[0].exporter_pid == 4243);
  CHECK(l.imports[0].token == (vmm_token_tag | 7));
  REQUIRE(l.access.size() == 1);  // over the import, not over the unidentified mapping
  CHECK(l.access[0].size == 4 * MiB);
  CHECK(check(l, "vmm").empty());

  // Its exporter is told when the last mapping and reference go, once.
  std::vector<std::uint64_t> released;
  r.unmap(a, 4 * MiB, released);
  CHECK(r.take_dropped_imports().empty());  // still referenced
  r.release_not_owned(token);
  const auto dropped = r.take_dropped_imports();
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0].token == (vmm_token_tag | 7));
  CHECK(r.take_dropped_imports().empty());
  CHECK(released.empty());  // not ours to release to the driver
}

TEST_CASE("vmm registry: an import keeps the program's value while the driver's handle under it is made again",
          "[vmm]") {
  vmm_registry r(base, default_vmm_window);
  std::uint64_t a = 0;
  REQUIRE(r.reserve(0, 4 * MiB, 0, 0, a) == vmm_status::ok);
  vmm_import origin = sample_import();
  origin.addr = origin.size = origin.offset = 0;
  const std::uint64_t token = r.add_import(0x7f00000a0000, origin);
  CHECK(r.add_import(0x7f00000a0000, origin) == token);  // the same driver handle imported twice: one value
  REQUIRE(r.map(a, 4 * MiB, 0, token) == vmm_status::ok);
  const vmm_access rw{1, 0, 3};
  r.set_access(a, 4 * MiB, std::span(&rw, 1));
  CHECK(r.import_token_of(0x7f00000a0000) == token);
  CHECK_FALSE(r.import_token_of(0x7f00000b0000).has_value());
  CHECK(r.driver_value(0x7f00000b0000) == 0x7f00000b0000);  // not an import token: the driver's own

  // A job's suspend gives the import back: the value and the records stay, with no driver handle under it.
  auto held = r.identified_imports();
  REQUIRE(held.size() == 1);
  CHECK(held[0].token == token);
  CHECK(held[0].refs == 2);
  REQUIRE(held[0].mappings.size() == 1);
  CHECK(held[0].mappings[0].addr == a);
  r.set_import_real(token, 0);
  CHECK(r.driver_value(token) == 0);
  CHECK(r.knows_import(token));
  const vmm_layout before = r.layout();

  // Its resume imports it again under another driver handle, from an exporter that started anew.
  r.set_import_real(token, 0x7f00000c0000, 999);
  CHECK(r.driver_value(token) == 0x7f00000c0000);
  CHECK(r.import_token_of(0x7f00000c0000) == token);
  CHECK(r.identified_imports()[0].origin.exporter_start == 999);
  const vmm_layout after = r.layout();
  REQUIRE(after.imports.size() == 1);
  CHECK(after.imports[0].exporter_start == 999);
  CHECK(after.access == before.access);
  const auto over = r.access_over(a + MiB, MiB);
  REQUIRE(over.size() == 1);
  CHECK(over[0].addr == a + MiB);
  CHECK(over[0].size == MiB);
}

TEST_CASE("vmm registry: a suspend can keep some handles (host memory) while the others give their memory back",
          "[vmm]") {
  vmm_registry r(base, default_vmm_window);
  vmm_properties device, host;
  host.bytes[0] = 9;
  const std::uint64_t t1 = r.add_handle(1001, 2 * MiB, 0, 0, device), t2 = r.add_handle(1002, 2 * MiB, 0, 0, host);
  const auto taken = r.take_real([](const vmm_handle& h) { return h.properties.bytes[0] == 9; });
  CHECK(taken == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{t1, 1001}});
  CHECK(r.find_handle(t1)->real == 0);
  CHECK(r.find_handle(t2)->real == 1002);
}
