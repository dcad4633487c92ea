// The device memory that passes through the shim, counted by kind: what an image of this process lacks.
#include "memory/not_owned_memory.hpp"

#include <array>
#include <atomic>
#include <limits>
#include <mutex>
#include <new>
#include <unordered_map>

#include "memory/vmm_state.hpp"
#include "vmmckpt/support/log.hpp"

namespace vmmckpt::detail {
namespace {

constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) { return b > most - a ? most : a + b; }
std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t out = 0;
  return __builtin_mul_overflow(a, b, &out) ? most : out;
}

struct record {
  passthrough_kind kind;
  std::uint64_t bytes;
};

struct passthrough_table {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, record> live;  // by pointer or handle
  std::array<std::uint64_t, 3> bytes{};            // by kind, under the mutex
  // Read without the lock by frees: zero means no passthrough memory was ever noted, and a free of
  // anything (almost always pool memory, answered before this) skips the table.
  std::atomic<std::size_t> noted{0};
};

passthrough_table& table() {
  static passthrough_table* t = new passthrough_table;  // never destroyed: frees may come during exit
  return *t;
}

std::size_t index_of(passthrough_kind kind) { return static_cast<std::size_t>(kind); }

// Bytes per element of one channel; the rarer and newer formats (packed, block-compressed) count as
// four, which keeps the estimate from being zero.
std::uint64_t element_bytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
  }
}

std::uint64_t at_least_one(std::uint64_t n) { return n == 0 ? 1 : n; }

}  // namespace

void note_passthrough(passthrough_kind kind, std::uint64_t key, std::uint64_t bytes) noexcept {
  passthrough_table& t = table();
  std::lock_guard lock(t.mutex);
  std::uint64_t& total = t.bytes[index_of(kind)];
  total = saturating_add(total, bytes);
  try {
    // A key the driver hands out again was freed behind our back (by a path we do not see): the old
    // record's bytes go.
    auto [it, added] = t.live.try_emplace(key, record{kind, bytes});
    if (!added) {
      t.bytes[index_of(it->second.kind)] -= it->second.bytes;
      it->second = record{kind, bytes};
    }
    t.noted.store(t.live.size(), std::memory_order_relaxed);
  } catch (const std::bad_alloc&) {
    log::warn("no memory to record {} bytes that pass through the shim: they stay counted as not owned", bytes);
  }
}

void forget_passthrough(std::uint64_t key) noexcept {
  passthrough_table& t = table();
  if (t.noted.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(t.mutex);
  const auto it = t.live.find(key);
  if (it == t.live.end()) return;
  t.bytes[index_of(it->second.kind)] -= it->second.bytes;
  t.live.erase(it);
  t.noted.store(t.live.size(), std::memory_order_relaxed);
}

std::uint64_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR& desc) noexcept {
  std::uint64_t bytes = saturating_mul(desc.Width, at_least_one(desc.Height));
  bytes = saturating_mul(bytes, at_least_one(desc.Depth));
  bytes = saturating_mul(bytes, desc.NumChannels);
  return saturating_mul(bytes, element_bytes(desc.Format));
}

std::uint64_t mipmapped_array_bytes(const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned levels) noexcept {
  CUDA_ARRAY3D_DESCRIPTOR level = desc;
  std::uint64_t bytes = 0;
  for (unsigned i = 0; i < levels; ++i) {
    bytes = saturating_add(bytes, array_bytes(level));
    // A dimension of 0 stays 0 (an array of fewer dimensions), others halve down to 1.
    level.Width = level.Width > 1 ? level.Width / 2 : level.Width;
    level.Height = level.Height > 1 ? level.Height / 2 : level.Height;
    level.Depth = level.Depth > 1 ? level.Depth / 2 : level.Depth;
  }
  return bytes;
}

std::vector<control::not_owned_memory> not_owned_memory() {
  std::array<std::uint64_t, 3> passthrough{};
  {
    passthrough_table& t = table();
    std::lock_guard lock(t.mutex);
    passthrough = t.bytes;
  }
  const vmm_not_owned_bytes vmm = not_owned_vmm_bytes();
  const std::pair<std::string_view, std::uint64_t> kinds[] = {
      {control::not_owned_kind::managed, passthrough[index_of(passthrough_kind::managed)]},
      {control::not_owned_kind::arrays, passthrough[index_of(passthrough_kind::arrays)]},
      {control::not_owned_kind::memory_pools, passthrough[index_of(passthrough_kind::memory_pools)]},
      {control::not_owned_kind::vmm_host, vmm.host},
      {control::not_owned_kind::vmm_other, vmm.other},
      {control::not_owned_kind::vmm_imported, vmm.imported},
      {control::not_owned_kind::vmm_unmapped, vmm.unmapped},
  };
  std::vector<control::not_owned_memory> out;
  for (const auto& [kind, bytes] : kinds)
    if (bytes > 0) out.push_back({std::string(kind), bytes});
  return out;
}

}  // namespace vmmckpt::detail
