// Unit tests of the VMM registry: placement in the windows, tokens, refcounts, mappings, access, config.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "vmmckpt/pool/vmm_registry.hpp"

using namespace vmmckpt;

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t GiB = 1ULL << 30;
constexpr std::uint64_t base = default_vmm_base;
constexpr std::uint64_t window = default_vmm_window;

vmm_properties props(unsigned char tag) {
  vmm_properties p;
  p.bytes[0] = tag;
  return p;
}

std::uint64_t reserve(vmm_registry& r, int device, std::uint64_t size, std::uint64_t alignment = 0,
                      std::uint64_t hint = 0) {
  std::uint64_t addr = 0;
  REQUIRE(r.reserve(device, size, alignment, hint, addr) == vmm_status::ok);
  return addr;
}

// A PyTorch-like run: a big reservation, 20 MiB handles mapped one by one, a hole, more reservations.
std::vector<std::uint64_t> scripted_run() {
  vmm_registry r(base, window);
  std::vector<std::uint64_t> seen;
  const std::uint64_t big = reserve(r, 0, 90 * GiB);
  seen.push_back(big);
  for (int i = 0; i < 8; ++i) {
    const std::uint64_t t = r.add_handle(1000 + i, 20 * MiB, 0, 0, props(1));
    seen.push_back(t);
    REQUIRE(r.map(big + i * 20 * MiB, 20 * MiB, 0, t) == vmm_status::ok);
  }
  seen.push_back(reserve(r, 0, 6 * MiB, 8 * MiB));
  seen.push_back(reserve(r, 1, 2 * MiB));
  std::vector<std::uint64_t> released;
  r.unmap(big + 3 * 20 * MiB, 20 * MiB, released);
  REQUIRE(r.release(seen[4], released) == vmm_status::ok);
  seen.push_back(r.add_handle(2000, 20 * MiB, 0, 0, props(1)));
  seen.push_back(reserve(r, 0, 2 * MiB));
  return seen;
}

}  // namespace

TEST_CASE("vmm: the same calls give the same addresses and tokens", "[vmm]") {
  const auto first = scripted_run();
  const auto second = scripted_run();
  REQUIRE(first == second);
  REQUIRE(first[0] == base);  // the first reservation opens device 0's window
  REQUIRE(looks_like_vmm_token(first[1]));
  REQUIRE(first[1] == (vmm_token_tag | 1));  // the n-th create gets counter n
  REQUIRE(first[9] == base + 90 * GiB);      // right after the big one, which ends 8 MiB-aligned
}

TEST_CASE("vmm: placement is lowest-address first fit with the alignment honoured", "[vmm]") {
  vmm_registry r(base, window);
  const std::uint64_t a = reserve(r, 0, 2 * MiB);
  REQUIRE(a == base);
  // Sizes that are not whole granules occupy whole granules.
  const std::uint64_t b = reserve(r, 0, 3 * MiB);
  REQUIRE(b == base + 2 * MiB);
  // A larger power-of-two alignment skips to the next boundary; an alignment below the granularity
  // (or 0) is the granularity.
  const std::uint64_t c = reserve(r, 0, 2 * MiB, 1 * GiB);
  REQUIRE(c == base + 1 * GiB);
  REQUIRE(reserve(r, 0, 2 * MiB, 4096) == base + 6 * MiB);
  // The gap before c is found first.
  REQUIRE(reserve(r, 0, 100 * MiB) == base + 8 * MiB);
  std::uint64_t addr = 0;
  REQUIRE(r.reserve(0, 2 * MiB, 3 * MiB, 0, addr) == vmm_status::invalid_value);
  REQUIRE(r.reserve(0, 0, 0, 0, addr) == vmm_status::invalid_value);
  REQUIRE(r.reserve(16, 2 * MiB, 0, 0, addr) == vmm_status::invalid_value);
  REQUIRE(r.reserve(-1, 2 * MiB, 0, 0, addr) == vmm_status::invalid_value);
  // Each device has its own window.
  REQUIRE(reserve(r, 3, 2 * MiB) == base + 3 * window);
  REQUIRE(reserve(r, 15, 2 * MiB) == base + 15 * window);
  // Freed space is reused from the lowest address.
  std::vector<std::uint64_t> released;
  REQUIRE(r.free_reservation(b, 3 * MiB, released) == vmm_status::ok);
  REQUIRE(reserve(r, 0, 4 * MiB) == b);
}

TEST_CASE("vmm: a hint is honoured only when free inside a window", "[vmm]") {
  vmm_registry r(base, window);
  // Free, aligned and inside device 2's window: honoured, and the reservation is that device's.
  const std::uint64_t hint = base + 2 * window + 64 * GiB;
  REQUIRE(reserve(r, 0, 4 * MiB, 0, hint) == hint);
  REQUIRE(r.reservations().back().device == 2);
  // Taken: placed as if no hint was given.
  REQUIRE(reserve(r, 0, 2 * MiB, 0, hint + 2 * MiB) == base);
  // Outside every window (below, above, straddling the end of one): ignored.
  REQUIRE(reserve(r, 0, 2 * MiB, 0, 0x7f0000000000ULL) == base + 2 * MiB);
  REQUIRE(reserve(r, 0, 2 * MiB, 0, base - 2 * GiB) == base + 4 * MiB);
  REQUIRE(reserve(r, 1, 4 * MiB, 0, base + 2 * window - 2 * MiB) == base + window);
  // Misaligned for the requested alignment: ignored.
  REQUIRE(reserve(r, 0, 2 * MiB, 1 * GiB, base + 5 * window + 2 * MiB) == base + 1 * GiB);
  // Deterministic: a fresh registry gives the same answers to the same calls.
  vmm_registry again(base, window);
  REQUIRE(reserve(again, 0, 4 * MiB, 0, hint) == hint);
  REQUIRE(reserve(again, 0, 2 * MiB, 0, hint + 2 * MiB) == base);
}

TEST_CASE("vmm: a full window answers out of memory and works again after a free", "[vmm]") {
  vmm_registry r(base, 64 * MiB, 2);
  std::vector<std::uint64_t> held;
  std::uint64_t addr = 0;
  while (r.reserve(0, 8 * MiB, 0, 0, addr) == vmm_status::ok) held.push_back(addr);
  REQUIRE(held.size() == 8);
  REQUIRE(r.reserve(0, 2 * MiB, 0, 0, addr) == vmm_status::out_of_memory);
  REQUIRE(r.reserve(0, 1ULL << 62, 0, 0, addr) == vmm_status::out_of_memory);
  REQUIRE(r.reserve(0, UINT64_MAX - 1, 0, 0, addr) == vmm_status::out_of_memory);
  // The other device's window is untouched.
  REQUIRE(reserve(r, 1, 64 * MiB) == base + 64 * MiB);
  std::vector<std::uint64_t> released;
  REQUIRE(r.free_reservation(held[5], 8 * MiB, released) == vmm_status::ok);
  REQUIRE(reserve(r, 0, 8 * MiB) == held[5]);
  REQUIRE(r.reserve(0, 16 * MiB, 0, 0, addr) == vmm_status::out_of_memory);
}

TEST_CASE("vmm: a free must name exactly one reservation", "[vmm]") {
  vmm_registry r(base, window);
  const std::uint64_t a = reserve(r, 0, 10 * MiB);
  REQUIRE(r.check_free(a, 8 * MiB) == vmm_status::invalid_value);
  REQUIRE(r.check_free(a + 2 * MiB, 8 * MiB) == vmm_status::invalid_value);
  REQUIRE(r.check_free(a, 10 * MiB) == vmm_status::ok);
  REQUIRE(r.check_free(0x7000000000ULL, 2 * MiB) == vmm_status::not_found);  // not ours: passes through
  std::vector<std::uint64_t> released;
  REQUIRE(r.free_reservation(a, 12 * MiB, released) == vmm_status::invalid_value);
  REQUIRE(r.reservations().size() == 1);
  REQUIRE(r.free_reservation(a, 10 * MiB, released) == vmm_status::ok);
  REQUIRE(r.reservations().empty());
  REQUIRE(r.check_free(a, 10 * MiB) == vmm_status::not_found);
}

TEST_CASE("vmm: a partial unmap splits mappings and the hole can be refilled", "[vmm]") {
  vmm_registry r(base, window);
  const std::uint64_t va = reserve(r, 0, 1 * GiB);
  const std::uint64_t t1 = r.add_handle(11, 60 * MiB, 0, 0, props(1));
  const std::uint64_t t2 = r.add_handle(12, 20 * MiB, 0, 0, props(1));
  REQUIRE(r.map(va, 60 * MiB, 0, t1) == vmm_status::ok);
  REQUIRE(r.map(va + 60 * MiB, 20 * MiB, 0, t2) == vmm_status::ok);
  REQUIRE(r.map(va + 50 * MiB, 20 * MiB, 0, t2) == vmm_status::invalid_value);  // overlaps
  std::vector<std::uint64_t> released;
  // A hole inside t1's mapping: two records, the right one from its own offset.
  r.unmap(va + 20 * MiB, 10 * MiB, released);
  REQUIRE(released.empty());
  auto m = r.mappings();
  REQUIRE(m.size() == 3);
  REQUIRE(m[0] == vmm_mapping{va, 20 * MiB, t1, 0});
  REQUIRE(m[1] == vmm_mapping{va + 30 * MiB, 30 * MiB, t1, 30 * MiB});
  REQUIRE(m[2] == vmm_mapping{va + 60 * MiB, 20 * MiB, t2, 0});
  REQUIRE(r.find_handle(t1)->mappings == 2);
  // An unmap across two mappings' edges trims both.
  r.unmap(va + 50 * MiB, 20 * MiB, released);
  m = r.mappings();
  REQUIRE(m.size() == 3);
  REQUIRE(m[1] == vmm_mapping{va + 30 * MiB, 20 * MiB, t1, 30 * MiB});
  REQUIRE(m[2] == vmm_mapping{va + 70 * MiB, 10 * MiB, t2, 10 * MiB});
  // The hole refilled by another handle.
  const std::uint64_t t3 = r.add_handle(13, 10 * MiB, 0, 0, props(1));
  REQUIRE(r.map(va + 20 * MiB, 10 * MiB, 0, t3) == vmm_status::ok);
  REQUIRE(r.mapping_at(va + 25 * MiB)->token == t3);
  REQUIRE(r.mapping_at(va + 55 * MiB) == std::nullopt);
  // Released, then the last mapping unmapped: the record goes and its real handle is handed back.
  REQUIRE(r.release(t1, released) == vmm_status::ok);
  REQUIRE(released.empty());
  REQUIRE(r.find_handle(t1) != nullptr);
  REQUIRE(r.live_handle(t1) == nullptr);
  r.unmap(va, 80 * MiB, released);
  REQUIRE(released == std::vector<std::uint64_t>{11});
  REQUIRE(r.find_handle(t1) == nullptr);
  REQUIRE(r.mappings().empty());
  REQUIRE(r.find_handle(t2)->mappings == 0);
}

TEST_CASE("vmm: retain on any interior address counts a reference", "[vmm]") {
  vmm_registry r(base, window);
  const std::uint64_t va = reserve(r, 0, 100 * MiB);
  const std::uint64_t t = r.add_handle(7, 40 * MiB, 0, 0, props(1));
  REQUIRE(r.map(va + 20 * MiB, 40 * MiB, 0, t) == vmm_status::ok);
  std::uint64_t got = 0;
  REQUIRE(r.retain_at(va + 20 * MiB, got) == vmm_status::ok);
  REQUIRE(got == t);
  REQUIRE(r.retain_at(va + 20 * MiB + 12345, got) == vmm_status::ok);
  REQUIRE(r.retain_at(va + 60 * MiB - 1, got) == vmm_status::ok);
  REQUIRE(r.find_handle(t)->refs == 4);
  REQUIRE(r.retain_at(va + 60 * MiB, got) == vmm_status::not_found);  // just past the end
  REQUIRE(r.retain_at(va, got) == vmm_status::not_found);             // reserved, not mapped
  REQUIRE(r.find_handle(t)->refs == 4);
}

TEST_CASE("vmm: a handle lives while referenced or mapped", "[vmm]") {
  vmm_registry r(base, window);
  const std::uint64_t va = reserve(r, 0, 40 * MiB);
  vmm_properties p = props(42);
  const std::uint64_t t = r.add_handle(99, 20 * MiB, 0, 5, p);
  const vmm_handle* h = r.live_handle(t);
  REQUIRE(h != nullptr);
  REQUIRE(h->real == 99);
  REQUIRE(h->flags == 5);
  REQUIRE(h->properties.bytes == p.bytes);
  REQUIRE(r.map(va, 20 * MiB, 0, t) == vmm_status::ok);
  std::uint64_t got = 0;
  REQUIRE(r.retain_at(va, got) == vmm_status::ok);  // 2 references
  std::vector<std::uint64_t> released;
  REQUIRE(r.release(t, released) == vmm_status::ok);
  REQUIRE(r.release(t, released) == vmm_status::ok);
  REQUIRE(released.empty());                                     // still mapped: the token stays valid for that memory
  REQUIRE(r.release(t, released) == vmm_status::invalid_value);  // a third release: no reference left
  REQUIRE(r.live_handle(t) == nullptr);
  REQUIRE(r.map(va + 20 * MiB, 20 * MiB, 0, t) == vmm_status::not_found);  // a released token maps nothing
  REQUIRE(r.retain_at(va + 1, got) == vmm_status::ok);                     // retained again through its mapping
  REQUIRE(r.live_handle(t) != nullptr);
  REQUIRE(r.replace_real(t, 1234));
  REQUIRE(r.release(t, released) == vmm_status::ok);
  r.unmap(va, 20 * MiB, released);
  REQUIRE(released == std::vector<std::uint64_t>{1234});
  REQUIRE(r.release(t, released) == vmm_status::not_found);
  REQUIRE(r.handles().empty());
  // Unmapped first, released after: the release hands the real handle back.
  const std::uint64_t t2 = r.add_handle(100, 20 * MiB, 0, 0, p);
  REQUIRE(r.map(va, 20 * MiB, 0, t2) == vmm_status::ok);
  released.clear();
  r.unmap(va, 20 * MiB, released);
  REQUIRE(released.empty());
  REQUIRE(r.release(t2, released) == vmm_status::ok);
  REQUIRE(released == std::vector<std::uint64_t>{100});
}

TEST_CASE("vmm: access set over many mappings is one record, split by holes", "[vmm]") {
  vmm_registry r(base, window);
  const std::uint64_t va = reserve(r, 0, 1 * GiB);
  for (int i = 0; i < 10; ++i) {
    const std::uint64_t t = r.add_handle(200 + i, 20 * MiB, 0, 0, props(1));
    REQUIRE(r.map(va + i * 20 * MiB, 20 * MiB, 0, t) == vmm_status::ok);
  }
  const vmm_access dev0{1, 0, 3};
  r.set_access(va, 200 * MiB, std::vector<vmm_access>{dev0});
  auto a = r.access();
  REQUIRE(a.size() == 1);
  REQUIRE(a[0].addr == va);
  REQUIRE(a[0].size == 200 * MiB);
  REQUIRE(a[0].access == std::vector<vmm_access>{dev0});
  // A peer added later over part of it: three records, the middle one with both devices.
  const vmm_access dev1{1, 1, 1};
  r.set_access(va + 40 * MiB, 60 * MiB, std::vector<vmm_access>{dev1});
  a = r.access();
  REQUIRE(a.size() == 3);
  REQUIRE(a[1].addr == va + 40 * MiB);
  REQUIRE(a[1].access == std::vector<vmm_access>{dev0, dev1});
  // The peer over the rest too: one record again.
  r.set_access(va, 40 * MiB, std::vector<vmm_access>{dev1});
  r.set_access(va + 100 * MiB, 100 * MiB, std::vector<vmm_access>{dev1});
  a = r.access();
  REQUIRE(a.size() == 1);
  REQUIRE(a[0].access == std::vector<vmm_access>{dev0, dev1});
  // Changing a device's flags replaces them.
  r.set_access(va, 200 * MiB, std::vector<vmm_access>{vmm_access{1, 1, 3}});
  REQUIRE(r.access()[0].access == std::vector<vmm_access>{dev0, vmm_access{1, 1, 3}});
  // A hole: its access goes with its mapping; refilled, it gets its own access later.
  std::vector<std::uint64_t> released;
  r.unmap(va + 60 * MiB, 20 * MiB, released);
  a = r.access();
  REQUIRE(a.size() == 2);
  REQUIRE(a[0].size == 60 * MiB);
  REQUIRE(a[1].addr == va + 80 * MiB);
  const std::uint64_t t = r.add_handle(300, 20 * MiB, 0, 0, props(1));
  REQUIRE(r.map(va + 60 * MiB, 20 * MiB, 0, t) == vmm_status::ok);
  r.set_access(va + 60 * MiB, 20 * MiB, std::vector<vmm_access>{dev0});
  a = r.access();
  REQUIRE(a.size() == 3);
  REQUIRE(a[1].access == std::vector<vmm_access>{dev0});
  // Over the whole range at once: gaps and records updated alike, merged into one.
  r.set_access(va, 200 * MiB, std::vector<vmm_access>{dev0, vmm_access{1, 1, 3}});
  REQUIRE(r.access().size() == 1);
}

TEST_CASE("vmm: freeing a reservation drops what was mapped in it", "[vmm]") {
  vmm_registry r(base, window);
  const std::uint64_t va = reserve(r, 0, 40 * MiB);
  const std::uint64_t t = r.add_handle(5, 40 * MiB, 0, 0, props(1));
  REQUIRE(r.map(va, 40 * MiB, 0, t) == vmm_status::ok);
  r.set_access(va, 40 * MiB, std::vector<vmm_access>{vmm_access{1, 0, 3}});
  std::vector<std::uint64_t> released;
  REQUIRE(r.release(t, released) == vmm_status::ok);
  REQUIRE(r.free_reservation(va, 40 * MiB, released) == vmm_status::ok);
  REQUIRE(released == std::vector<std::uint64_t>{5});
  REQUIRE(r.mappings().empty());
  REQUIRE(r.access().empty());
  REQUIRE(r.handles().empty());
}

TEST_CASE("vmm: memory that passes through is counted by kind", "[vmm]") {
  vmm_registry r(base, window);
  r.add_not_owned(0x1000, vmm_not_owned_kind::host, 64 * MiB);
  r.add_not_owned(0x2000, vmm_not_owned_kind::other, 8 * MiB);
  r.add_not_owned(0x3000, vmm_not_owned_kind::imported, 0);
  REQUIRE(r.not_owned_bytes().host == 64 * MiB);
  REQUIRE(r.not_owned_bytes().other == 8 * MiB);
  REQUIRE(r.not_owned_bytes().imported == 0);
  const std::uint64_t va = reserve(r, 0, 100 * MiB);
  // Imported memory counts what is mapped of it, split by partial unmaps like any mapping.
  REQUIRE(r.map(va, 40 * MiB, 0, 0x3000) == vmm_status::ok);
  REQUIRE(r.not_owned_bytes().imported == 40 * MiB);
  REQUIRE(r.mappings().empty());  // not ours: not among the mappings a dump would save
  REQUIRE(r.mapping_at(va) == std::nullopt);
  std::vector<std::uint64_t> released;
  r.unmap(va + 10 * MiB, 10 * MiB, released);
  REQUIRE(r.not_owned_bytes().imported == 30 * MiB);
  REQUIRE(released.empty());  // never ours to release
  // Unknown values are neither recorded nor counted.
  REQUIRE(r.map(va + 60 * MiB, 20 * MiB, 0, 0x4000) == vmm_status::not_found);
  // Host memory: from create to the last release.
  r.retain_not_owned(0x1000);
  r.release_not_owned(0x1000);
  REQUIRE(r.not_owned_bytes().host == 64 * MiB);
  r.release_not_owned(0x1000);
  REQUIRE(r.not_owned_bytes().host == 0);
  REQUIRE(r.not_owned_bytes().total() == 8 * MiB + 30 * MiB);
  r.release_not_owned(0x3000);
  r.unmap(va, 100 * MiB, released);
  REQUIRE(r.not_owned_bytes().imported == 0);
}

TEST_CASE("vmm: tokens are tagged and counted, and only live tokens are handles", "[vmm]") {
  vmm_registry r(base, window);
  REQUIRE_FALSE(looks_like_vmm_token(0));
  REQUIRE_FALSE(looks_like_vmm_token(1));
  REQUIRE_FALSE(looks_like_vmm_token(vmm_token_tag));
  REQUIRE_FALSE(looks_like_vmm_token(0x00007f1234567000ULL));
  for (std::uint64_t n = 1; n <= 3; ++n) {
    const std::uint64_t t = r.add_handle(n, 2 * MiB, 0, 0, props(1));
    REQUIRE(t == (vmm_token_tag | n));
    REQUIRE(looks_like_vmm_token(t));
  }
  REQUIRE(r.live_handle(vmm_token_tag | 4) == nullptr);
  REQUIRE(r.live_handle(1) == nullptr);
  const auto all = r.handles();
  REQUIRE(all.size() == 3);
  REQUIRE(all[0].token < all[1].token);
}

TEST_CASE("vmm: the window is configured from the environment and checked against the pools", "[vmm][config]") {
  std::string error;
  const pool_config pools;
  ::unsetenv(env_vmm_base);
  ::unsetenv(env_vmm_window);
  vmm_config cfg = vmm_config_from_env(pools, error);
  REQUIRE(error.empty());
  REQUIRE(cfg.base == 0x300000000000ULL);
  REQUIRE(cfg.window == 2ULL << 40);
  REQUIRE(cfg.device_base(15) + cfg.window == 0x500000000000ULL);

  ::setenv(env_vmm_base, "0x600000000000", 1);
  ::setenv(env_vmm_window, "256G", 1);
  cfg = vmm_config_from_env(pools, error);
  REQUIRE(error.empty());
  REQUIRE(cfg.device_base(1) == 0x600000000000ULL + (256ULL << 30));

  ::setenv(env_vmm_window, "3M", 1);
  vmm_config_from_env(pools, error);
  REQUIRE(error.find("VMMCKPT_VMM_WINDOW") != std::string::npos);
  ::setenv(env_vmm_window, "pear", 1);
  vmm_config_from_env(pools, error);
  REQUIRE(error.find("pear") != std::string::npos);
  ::setenv(env_vmm_window, "4T", 1);  // 16 windows past 128 TiB
  vmm_config_from_env(pools, error);
  REQUIRE(error.find("128 TiB") != std::string::npos);
  ::setenv(env_vmm_window, "1T", 1);
  ::setenv(env_vmm_base, "0x200000200000", 1);  // over the pools
  vmm_config_from_env(pools, error);
  REQUIRE(error.find("overlap") != std::string::npos);
  ::setenv(env_vmm_base, "0x100000000000", 1);  // 16 TiB of windows ending where the pools begin
  vmm_config_from_env(pools, error);
  REQUIRE(error.empty());
  ::unsetenv(env_vmm_base);
  ::unsetenv(env_vmm_window);
}
