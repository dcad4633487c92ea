// Manifests of many allocations: decoding and checking cost time linear in their size.
//
// Not a timed test of speed (bench/ measures that): a test of how the cost grows. Eight times the
// allocations must cost well under 64 times the time, which a quadratic parse costs: a wide gap, so
// that a loaded machine (CI runs tests side by side) cannot close it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <string>

#include "vmmckpt/image/image.hpp"

namespace img = vmmckpt::image;

namespace {

// A valid manifest of n 256-byte allocations, one extent each, as a dump of small blocks writes it.
std::string manifest_text(std::size_t n) {
  constexpr std::uint64_t base = 0x200000000000ULL;
  img::manifest m;
  m.format = 4;  // extents without blocks: this measures the allocation and extent rules
  m.block_size = 0;
  m.image_id = "0123456789abcdef0123456789abcdef";
  m.tool_version = "test";
  m.created = "2026-11-23T00:00:00Z";
  m.host = "test";
  m.pid = 42;
  m.command = {"test"};
  m.devices = {{0, "emulated", "GPU-00000000-0000-0000-0000-000000000000", 9, 0}};
  img::pool p;
  p.device = 0;
  p.base = base;
  p.size = 512ULL << 30;
  p.granularity = 2ULL << 20;
  for (std::size_t i = 0; i < n; ++i) {
    p.allocations.push_back({base + i * 512, 256, vmmckpt::alloc_api::cuda_malloc});
    p.extents.push_back({base + i * 512, 256, 256, 0, i * 256, 0x1234, {}});
  }
  m.pools.push_back(std::move(p));
  m.data_bytes = n * 256;
  return img::to_json(m);
}

// The least of three: other work on the machine only ever adds time.
double seconds_to_decode(const std::string& text) {
  const auto start = std::chrono::steady_clock::now();
  const img::manifest m = img::from_json(text);
  img::validate(m);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("decoding and validating a manifest is linear in its allocations", "[image][scale]") {
  const std::string small = manifest_text(12'500), large = manifest_text(100'000);
  // The best of rounds taken in turn: a loaded machine slows some rounds, and taking them in turn keeps a
  // burst of load from falling on one size alone.
  double t_small = 1e9, t_large = 1e9;
  for (int round = 0; round < 5; ++round) {
    t_small = std::min(t_small, seconds_to_decode(small));
    t_large = std::min(t_large, seconds_to_decode(large));
  }
  INFO("12.5k allocations: " << t_small << " s, 100k: " << t_large << " s");
  // Linear: about 8; quadratic: about 64.
  REQUIRE(t_large < 24 * t_small);
}
