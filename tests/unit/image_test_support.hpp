// What the image unit tests share: a scratch directory and reproducible bytes.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "vmmckpt/image/image.hpp"

namespace vmmckpt::test {

// A fresh directory under /tmp, removed with everything in it (made writable first: tests take
// permissions away to make writes fail).
struct scratch {
  std::filesystem::path dir;
  scratch() {
    char tmpl[] = "/tmp/vmmckpt-image-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~scratch() {
    std::error_code ec;
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(dir, ec);
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return dir / name; }
};

// `size` bytes from a generator seeded with `seed`: the same bytes for the same seed.
inline std::vector<unsigned char> pattern(std::uint64_t size, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(size);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// XORs `mask` into the byte at `offset` of `file`: damage that every checksum must catch.
inline void flip_byte(const std::filesystem::path& file, std::uint64_t offset, unsigned char mask = 0x01) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// The manifest of a one-GPU process with one pool at `base` holding one cudaMalloc allocation of `bytes` bytes,
// no extents yet: what the chain and zero-block tests write images of.
inline image::manifest one_allocation_manifest(std::uint64_t base, std::uint64_t bytes) {
  image::manifest m;
  m.tool_version = "test";
  m.created = "2026-11-25T00:00:00Z";
  m.host = "node";
  m.pid = 42;
  m.devices = {{0, "GPU", "GPU-0", 9, 0}};
  image::pool pl;
  pl.base = base;
  pl.size = 512ULL << 30;
  pl.granularity = 2ULL << 20;
  pl.allocations.push_back({base, bytes, alloc_api::cuda_malloc});
  m.pools.push_back(pl);
  return m;
}

}  // namespace vmmckpt::test
