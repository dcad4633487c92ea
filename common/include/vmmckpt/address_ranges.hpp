// Disjoint address ranges (mapped memory), asked whether a range lies wholly inside them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace vmmckpt {

class address_ranges {
 public:
  address_ranges() = default;
  // [addr, addr + size) pairs, in any order; they must not overlap.
  explicit address_ranges(std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges) : ranges_(std::move(ranges)) {
    std::sort(ranges_.begin(), ranges_.end());
  }

  // True when every byte of [addr, addr + size) is in the ranges (ranges that touch count as one).
  // A binary search a range: a million allocations check in milliseconds. Safe from several threads.
  bool covers(std::uint64_t addr, std::uint64_t size) const {
    if (size > ~std::uint64_t{0} - addr) return false;
    for (std::uint64_t cursor = addr; cursor < addr + size;) {
      auto it = std::upper_bound(ranges_.begin(), ranges_.end(), cursor,
                                 [](std::uint64_t a, const std::pair<std::uint64_t, std::uint64_t>& r) { return a < r.first; });
      if (it == ranges_.begin()) return false;
      --it;
      if (cursor - it->first >= it->second) return false;
      cursor = it->first + it->second;
    }
    return true;
  }

 private:
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges_;  // (addr, size), by address
};

}  // namespace vmmckpt
