// Disjoint address ranges (mapped memory), asked whether a range lies wholly inside them.
#pragma once

#include <algorithm>
#include <cstddef>
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
    std::size_t hint = 0;
    return covers(addr, size, hint);
  }

  // For questions that come in address order, mostly about the range the last one was in: each
  // asks that range first, and searches only when it does not hold the answer. One per thread.
  class cursor {
   public:
    explicit cursor(const address_ranges& r) : r_(r) {}
    bool covers(std::uint64_t addr, std::uint64_t size) { return r_.covers(addr, size, at_); }

   private:
    const address_ranges& r_;
    std::size_t at_ = 0;
  };

 private:
  // `hint`: the index of a range to try first; left at the last range the answer used.
  bool covers(std::uint64_t addr, std::uint64_t size, std::size_t& hint) const {
    if (size > ~std::uint64_t{0} - addr) return false;
    for (std::uint64_t cursor = addr; cursor < addr + size;) {
      if (hint >= ranges_.size() || cursor < ranges_[hint].first ||
          cursor - ranges_[hint].first >= ranges_[hint].second) {
        auto it = std::upper_bound(
            ranges_.begin(), ranges_.end(), cursor,
            [](std::uint64_t a, const std::pair<std::uint64_t, std::uint64_t>& r) { return a < r.first; });
        if (it == ranges_.begin()) return false;
        hint = static_cast<std::size_t>(it - ranges_.begin()) - 1;
        if (cursor - ranges_[hint].first >= ranges_[hint].second) return false;
      }
      cursor = ranges_[hint].first + ranges_[hint].second;
      if (cursor < addr + size) ++hint;  // the next range, if they touch
    }
    return true;
  }

  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges_;  // (addr, size), by address
};

}  // namespace vmmckpt
