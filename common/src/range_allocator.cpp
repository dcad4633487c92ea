// Best-fit placement with coalescing for one pool's address range.
#include "vmmckpt/range_allocator.hpp"

#include "vmmckpt/pool_layout.hpp"

namespace vmmckpt {

range_allocator::range_allocator(std::uint64_t base, std::uint64_t size) : base_(base), size_(size) {
  if (size_ > 0) insert_free(base_, size_);
}

std::uint64_t range_allocator::rounded_size(std::uint64_t requested) {
  return align_up(requested == 0 ? 1 : requested, small_alignment);
}

std::uint64_t range_allocator::alignment_for(std::uint64_t rounded) {
  return rounded >= large_alignment ? large_alignment : small_alignment;
}

void range_allocator::insert_free(std::uint64_t addr, std::uint64_t size) {
  free_by_addr_.emplace(addr, size);
  free_by_size_.emplace(size, addr);
}

void range_allocator::erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_addr_.erase(it);
}

std::optional<std::uint64_t> range_allocator::allocate(std::uint64_t requested, std::uint32_t tag) {
  if (requested > size_) return std::nullopt;
  const std::uint64_t size = rounded_size(requested);
  const std::uint64_t alignment = alignment_for(size);

  // Smallest range that fits; among equal sizes the lowest address. Small
  // blocks need no padding (every free range starts 512-aligned), so the first
  // candidate fits; large ones may need to skip ranges that fit only unaligned.
  for (auto it = free_by_size_.lower_bound({size, 0}); it != free_by_size_.end(); ++it) {
    const auto [range_size, range_addr] = *it;
    const std::uint64_t start = align_up(range_addr, alignment);
    if (start - range_addr > range_size || range_size - (start - range_addr) < size) continue;

    erase_free(free_by_addr_.find(range_addr));
    if (start > range_addr) insert_free(range_addr, start - range_addr);
    const std::uint64_t end = start + size;
    if (end < range_addr + range_size) insert_free(end, range_addr + range_size - end);

    live_.emplace(start, block{start, size, requested, tag});
    live_bytes_ += size;
    return start;
  }
  return std::nullopt;
}

void range_allocator::free_range(std::uint64_t addr, std::uint64_t size) {
  std::uint64_t start = addr;
  std::uint64_t end = addr + size;
  auto next = free_by_addr_.lower_bound(addr);
  if (next != free_by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      erase_free(prev);
    }
  }
  next = free_by_addr_.lower_bound(addr);
  if (next != free_by_addr_.end() && next->first == end) {
    end += next->second;
    erase_free(next);
  }
  insert_free(start, end - start);
}

std::optional<range_allocator::block> range_allocator::retire(std::uint64_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) return std::nullopt;
  block b = it->second;
  live_.erase(it);
  live_bytes_ -= b.size;
  retired_.push_back(b);
  retired_bytes_ += b.size;
  return b;
}

void range_allocator::reclaim_retired() {
  for (const block& b : retired_) free_range(b.addr, b.size);
  retired_.clear();
  retired_bytes_ = 0;
}

bool range_allocator::release(std::uint64_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) return false;
  live_bytes_ -= it->second.size;
  free_range(it->second.addr, it->second.size);
  live_.erase(it);
  return true;
}

bool range_allocator::claim(std::uint64_t addr, std::uint64_t requested, std::uint32_t tag) {
  if (addr % small_alignment != 0 || requested == 0 || requested > size_) return false;
  const std::uint64_t size = rounded_size(requested);
  auto it = free_by_addr_.upper_bound(addr);
  if (it == free_by_addr_.begin()) return false;
  --it;
  const auto [range_addr, range_size] = *it;
  if (addr + size < addr || addr + size > range_addr + range_size) return false;
  erase_free(it);
  if (addr > range_addr) insert_free(range_addr, addr - range_addr);
  if (addr + size < range_addr + range_size) insert_free(addr + size, range_addr + range_size - addr - size);
  live_.emplace(addr, block{addr, size, requested, tag});
  live_bytes_ += size;
  return true;
}

const range_allocator::block* range_allocator::find(std::uint64_t addr) const {
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return nullptr;
  --it;
  return addr < it->second.addr + it->second.size ? &it->second : nullptr;
}

std::uint64_t range_allocator::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

std::vector<range_allocator::block> range_allocator::live_blocks() const {
  std::vector<block> out;
  out.reserve(live_.size());
  for (const auto& [addr, b] : live_) out.push_back(b);
  return out;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> range_allocator::free_ranges() const {
  return {free_by_addr_.begin(), free_by_addr_.end()};
}

const char* range_allocator::check_invariants() const {
  if (free_by_addr_.size() != free_by_size_.size()) return "free indexes differ in size";
  std::uint64_t covered = 0;
  std::uint64_t prev_end = 0;
  bool first = true;
  for (const auto& [addr, size] : free_by_addr_) {
    if (size == 0) return "empty free range";
    if (!free_by_size_.count({size, addr})) return "free range missing from size index";
    if (addr < base_ || addr + size > base_ + size_) return "free range outside the pool";
    if (!first && addr <= prev_end) return addr == prev_end ? "adjacent free ranges not coalesced" : "free ranges overlap";
    prev_end = addr + size;
    first = false;
    covered += size;
  }
  std::uint64_t live = 0;
  for (const auto& [addr, b] : live_) {
    if (addr % small_alignment != 0) return "live block misaligned";
    if (b.size >= large_alignment && addr % large_alignment != 0) return "large block not 2 MiB aligned";
    auto next_free = free_by_addr_.upper_bound(addr);
    if (next_free != free_by_addr_.begin()) {
      auto prev = std::prev(next_free);
      if (prev->first + prev->second > addr) return "live block overlaps a free range";
    }
    if (next_free != free_by_addr_.end() && next_free->first < addr + b.size) return "live block overlaps a free range";
    live += b.size;
  }
  if (live != live_bytes_) return "live byte count is wrong";
  std::uint64_t retired = 0;
  for (const block& b : retired_) retired += b.size;
  if (retired != retired_bytes_) return "retired byte count is wrong";
  if (covered + live + retired != size_) return "free + live + retired bytes do not add up to the pool";
  return "";
}

}  // namespace vmmckpt
