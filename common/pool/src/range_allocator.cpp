// Segregated best-fit placement with coalescing for one pool's address range.
#include "vmmckpt/pool/range_allocator.hpp"

#include <algorithm>

namespace vmmckpt {

range_allocator::range_allocator(std::uint64_t base, std::uint64_t size) : base_(base), size_(size) {
  if (size_ > 0) insert_free(free_by_size_, base_, size_);
}

std::uint64_t range_allocator::rounded_size(std::uint64_t requested) {
  return align_up(requested == 0 ? 1 : requested, small_alignment);
}

std::uint64_t range_allocator::alignment_for(std::uint64_t rounded) {
  return rounded >= large_alignment ? large_alignment : small_alignment;
}

std::uint64_t range_allocator::chunk_limit(std::uint64_t chunk) const {
  const std::uint64_t start = chunk_start(chunk);
  return size_ - (start - base_) < small_chunk_size ? base_ + size_ : start + small_chunk_size;
}

void range_allocator::insert_free(size_index& index, std::uint64_t addr, std::uint64_t size) {
  free_by_addr_.emplace(addr, size);
  index.emplace(size, addr);
}

void range_allocator::erase_free(size_index& index, free_map::iterator it) {
  index.erase({it->second, it->first});
  free_by_addr_.erase(it);
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> range_allocator::find_fit(const size_index& index,
                                                                                 std::uint64_t size,
                                                                                 std::uint64_t alignment,
                                                                                 std::uint64_t origin) const {
  // Smallest range that fits; among equal sizes the lowest address. Small blocks
  // need no padding (every free range starts 512-aligned), so the first
  // candidate fits; large ones may need to skip ranges that fit only unaligned.
  for (auto it = index.lower_bound({size, 0}); it != index.end(); ++it) {
    const auto [range_size, range_addr] = *it;
    const std::uint64_t start = origin + align_up(range_addr - origin, alignment);
    if (start - range_addr > range_size || range_size - (start - range_addr) < size) continue;
    return std::make_pair(range_addr, start);
  }
  return std::nullopt;
}

void range_allocator::carve(size_index& index, std::uint64_t range_addr, std::uint64_t start, std::uint64_t size) {
  auto it = free_by_addr_.find(range_addr);
  const std::uint64_t range_end = range_addr + it->second;
  erase_free(index, it);
  if (start > range_addr) insert_free(index, range_addr, start - range_addr);
  if (start + size < range_end) insert_free(index, start + size, range_end - start - size);
}

std::uint64_t range_allocator::place(std::uint64_t start, std::uint64_t size, std::uint64_t requested,
                                     std::uint32_t tag) {
  live_.emplace(start, block{start, size, requested, tag});
  live_bytes_ += size;
  if (is_small(size)) count_small(start, size, true);
  return start;
}

std::optional<std::uint64_t> range_allocator::allocate(std::uint64_t requested, std::uint32_t tag) {
  if (requested > size_) return std::nullopt;
  const std::uint64_t size = rounded_size(requested);
  const std::uint64_t alignment = alignment_for(size);

  if (is_small(size)) {
    if (auto fit = find_fit(small_free_, size, alignment, 0)) {
      carve(small_free_, fit->first, fit->second, size);
      return place(fit->second, size, requested, tag);
    }
    // No room in the chunks holding small blocks: the best-fitting wholly free chunk becomes one.
    if (auto fit = find_fit(free_by_size_, small_chunk_size, small_chunk_size, base_)) {
      make_small_chunk(chunk_of(fit->second));
      carve(small_free_, fit->second, fit->second, size);
      return place(fit->second, size, requested, tag);
    }
  }
  if (auto fit = find_fit(free_by_size_, size, alignment, 0)) {
    carve(free_by_size_, fit->first, fit->second, size);
    return place(fit->second, size, requested, tag);
  }
  if (!is_small(size)) {
    if (auto fit = find_fit(small_free_, size, alignment, 0)) {
      carve(small_free_, fit->first, fit->second, size);
      return place(fit->second, size, requested, tag);
    }
  }
  return std::nullopt;
}

void range_allocator::free_piece(std::uint64_t addr, std::uint64_t size, bool small, std::uint64_t chunk) {
  // Neighbours coalesce only within the same kind of space: inside one small-block
  // chunk, or both outside every such chunk.
  size_index& index = small ? small_free_ : free_by_size_;
  std::uint64_t start = addr;
  std::uint64_t end = addr + size;
  auto next = free_by_addr_.lower_bound(addr);
  if (next != free_by_addr_.begin()) {
    auto prev = std::prev(next);
    const bool same = (addr - base_) % small_chunk_size != 0 || (!small && !is_small_chunk(chunk - 1));
    if (same && prev->first + prev->second == start) {
      start = prev->first;
      erase_free(index, prev);
    }
  }
  if (next != free_by_addr_.end() && next->first == end) {
    const bool at_edge = (end - base_) % small_chunk_size == 0;
    const bool same = !at_edge || (!small && !is_small_chunk(chunk_of(end)));
    if (same) {
      end += next->second;
      erase_free(index, next);
    }
  }
  insert_free(index, start, end - start);
}

void range_allocator::free_range(std::uint64_t addr, std::uint64_t size) {
  const std::uint64_t end = addr + size;
  while (addr < end) {
    const std::uint64_t chunk = chunk_of(addr);
    const bool small = is_small_chunk(chunk);
    std::uint64_t piece_end = end;
    if (small) {
      piece_end = std::min(end, chunk_limit(chunk));
    } else {
      auto next_small = small_chunks_.upper_bound(chunk);
      if (next_small != small_chunks_.end()) piece_end = std::min(end, chunk_start(next_small->first));
    }
    free_piece(addr, piece_end - addr, small, chunk);
    addr = piece_end;
  }
}

void range_allocator::make_small_chunk(std::uint64_t chunk) {
  // The free ranges overlapping the chunk are taken out and put back split at its edges.
  const std::uint64_t start = chunk_start(chunk);
  const std::uint64_t end = chunk_limit(chunk);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  auto it = free_by_addr_.upper_bound(start);
  if (it != free_by_addr_.begin() && std::prev(it)->first + std::prev(it)->second > start) --it;
  while (it != free_by_addr_.end() && it->first < end) {
    ranges.emplace_back(*it);
    erase_free(free_by_size_, it++);
  }
  small_chunks_.emplace(chunk, 0);
  for (const auto& [addr, size] : ranges) free_range(addr, size);
}

void range_allocator::dissolve_small_chunk(std::uint64_t chunk) {
  const std::uint64_t start = chunk_start(chunk);
  const std::uint64_t end = chunk_limit(chunk);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (auto it = free_by_addr_.lower_bound(start); it != free_by_addr_.end() && it->first < end;) {
    ranges.emplace_back(*it);
    erase_free(small_free_, it++);
  }
  small_chunks_.erase(chunk);
  for (const auto& [addr, size] : ranges) free_range(addr, size);
}

void range_allocator::count_small(std::uint64_t addr, std::uint64_t size, bool add) {
  const std::uint64_t last = chunk_of(addr + size - 1);
  for (std::uint64_t chunk = chunk_of(addr); chunk <= last; ++chunk) {
    if (add) {
      auto it = small_chunks_.find(chunk);
      if (it == small_chunks_.end()) {
        make_small_chunk(chunk);
        it = small_chunks_.find(chunk);
      }
      ++it->second;
    } else {
      auto it = small_chunks_.find(chunk);
      if (--it->second == 0) dissolve_small_chunk(chunk);
    }
  }
}

std::optional<range_allocator::block> range_allocator::retire(std::uint64_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) return std::nullopt;
  block b = it->second;
  retired_.push_back(b);  // first: if it throws (no memory), the block is still live, nothing lost
  live_.erase(it);
  live_bytes_ -= b.size;
  retired_bytes_ += b.size;
  return b;
}

void range_allocator::reclaim_retired() {
  for (const block& b : retired_) {
    free_range(b.addr, b.size);
    if (is_small(b.size)) count_small(b.addr, b.size, false);
  }
  retired_.clear();
  retired_bytes_ = 0;
}

bool range_allocator::release(std::uint64_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) return false;
  const block b = it->second;
  live_.erase(it);
  live_bytes_ -= b.size;
  free_range(b.addr, b.size);
  if (is_small(b.size)) count_small(b.addr, b.size, false);
  return true;
}

bool range_allocator::claim(std::uint64_t addr, std::uint64_t requested, std::uint32_t tag) {
  if (addr % small_alignment != 0 || requested == 0 || requested > size_) return false;
  const std::uint64_t size = rounded_size(requested);
  const std::uint64_t end = addr + size;
  if (addr < base_ || end < addr || end > base_ + size_) return false;
  // The range may span free ranges of different kinds, back to back.
  auto it = free_by_addr_.upper_bound(addr);
  if (it == free_by_addr_.begin()) return false;
  --it;
  if (it->first + it->second <= addr) return false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> covered;
  for (std::uint64_t cursor = it->first; cursor < end; ++it) {
    if (it == free_by_addr_.end() || it->first != cursor) return false;
    covered.emplace_back(*it);
    cursor += it->second;
  }
  for (const auto& [range_addr, range_size] : covered) {
    size_index& index = index_at(range_addr);
    const std::uint64_t lo = std::max(range_addr, addr);
    const std::uint64_t hi = std::min(range_addr + range_size, end);
    carve(index, range_addr, lo, hi - lo);
  }
  place(addr, size, requested, tag);
  return true;
}

const range_allocator::block* range_allocator::find(std::uint64_t addr) const {
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return nullptr;
  --it;
  return addr < it->second.addr + it->second.size ? &it->second : nullptr;
}

std::uint64_t range_allocator::largest_free() const {
  const std::uint64_t outside = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  const std::uint64_t inside = small_free_.empty() ? 0 : small_free_.rbegin()->first;
  return std::max(outside, inside);
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

const char* range_allocator::check_free_ranges(std::uint64_t& free_bytes) const {
  if (free_by_addr_.size() != free_by_size_.size() + small_free_.size()) return "free indexes differ in size";
  std::uint64_t prev_end = 0;
  bool first = true;
  bool prev_small = false;
  std::uint64_t prev_chunk = 0;
  for (const auto& [addr, size] : free_by_addr_) {
    if (size == 0) return "empty free range";
    if (addr < base_ || addr + size > base_ + size_) return "free range outside the pool";
    const std::uint64_t chunk = chunk_of(addr);
    const bool small = is_small_chunk(chunk);
    if (!(small ? small_free_ : free_by_size_).count({size, addr})) return "free range missing from its size index";
    if (small && addr + size > chunk_limit(chunk)) return "free range crosses a small-block chunk's edge";
    if (!small) {
      auto next_small = small_chunks_.upper_bound(chunk);
      if (next_small != small_chunks_.end() && addr + size > chunk_start(next_small->first))
        return "free range runs into a small-block chunk";
    }
    if (!first && addr < prev_end) return "free ranges overlap";
    if (!first && addr == prev_end && small == prev_small && (!small || chunk == prev_chunk))
      return "adjacent free ranges not coalesced";
    prev_end = addr + size;
    prev_small = small;
    prev_chunk = chunk;
    first = false;
    free_bytes += size;
  }
  return "";
}

const char* range_allocator::check_blocks(std::map<std::uint64_t, std::uint32_t>& small_counts) const {
  auto count_chunks = [&](const block& b) {
    if (!is_small(b.size)) return;
    for (std::uint64_t c = chunk_of(b.addr); c <= chunk_of(b.addr + b.size - 1); ++c) ++small_counts[c];
  };
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
    count_chunks(b);
  }
  if (live != live_bytes_) return "live byte count is wrong";
  std::uint64_t retired = 0;
  for (const block& b : retired_) {
    retired += b.size;
    count_chunks(b);
  }
  if (retired != retired_bytes_) return "retired byte count is wrong";
  return "";
}

const char* range_allocator::check_invariants() const {
  std::uint64_t free_bytes = 0;
  if (const char* why = check_free_ranges(free_bytes); *why != '\0') return why;
  std::map<std::uint64_t, std::uint32_t> small_counts;
  if (const char* why = check_blocks(small_counts); *why != '\0') return why;
  if (free_bytes + live_bytes_ + retired_bytes_ != size_)
    return "free + live + retired bytes do not add up to the pool";
  if (small_counts != small_chunks_) return "small-block chunks do not match the small blocks";
  return "";
}

}  // namespace vmmckpt
