// Deterministic placement of blocks inside one pool's address range (no memory is touched).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace vmmckpt {

// Best fit, lowest address among equal fits, full coalescing. The free set is
// always a set of maximal intervals, so the address a request receives is a pure
// function of the sequence of allocate/free calls: the same sequence gives the
// same addresses in every run, whatever the GPU.
//
// Freeing is two steps so callers can delay reuse: retire() ends a block's life
// (it is no longer found, a second retire fails) but keeps its range occupied;
// reclaim_retired() makes retired ranges free. Placement after a reclaim equals
// placement with immediate frees.
class range_allocator {
 public:
  struct block {
    std::uint64_t addr = 0;
    std::uint64_t size = 0;       // rounded size the block occupies
    std::uint64_t requested = 0;  // size the caller asked for
    std::uint32_t tag = 0;        // caller's label (the API that allocated it)
  };

  range_allocator(std::uint64_t base, std::uint64_t size);

  // Returns the block's address, or nothing when no free range fits.
  std::optional<std::uint64_t> allocate(std::uint64_t requested, std::uint32_t tag = 0);

  // Ends the life of the block starting exactly at addr. Nothing when addr is
  // not the start of a live block (foreign pointer, interior pointer, double free).
  std::optional<block> retire(std::uint64_t addr);
  bool has_retired() const { return !retired_.empty(); }
  std::uint64_t retired_bytes() const { return retired_bytes_; }
  void reclaim_retired();

  // Frees a live block at once (used to undo an allocation that could not be backed).
  bool release(std::uint64_t addr);

  // Makes [addr, addr + rounded_size(requested)) a live block, as a restored
  // image dictates. False unless that whole range is free and addr is
  // 512-aligned. Placement afterwards is as if the block had been allocated.
  bool claim(std::uint64_t addr, std::uint64_t requested, std::uint32_t tag = 0);

  // The live block containing addr, if any.
  const block* find(std::uint64_t addr) const;

  std::uint64_t base() const { return base_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t live_bytes() const { return live_bytes_; }
  std::size_t live_count() const { return live_.size(); }
  std::size_t free_range_count() const { return free_by_addr_.size(); }
  std::uint64_t largest_free() const;

  std::vector<block> live_blocks() const;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> free_ranges() const;

  // Verifies the internal structures agree (for tests); returns an empty
  // string when consistent, else what is wrong.
  const char* check_invariants() const;

  static std::uint64_t rounded_size(std::uint64_t requested);
  static std::uint64_t alignment_for(std::uint64_t rounded);

 private:
  void insert_free(std::uint64_t addr, std::uint64_t size);
  void erase_free(std::map<std::uint64_t, std::uint64_t>::iterator it);
  void free_range(std::uint64_t addr, std::uint64_t size);

  std::uint64_t base_;
  std::uint64_t size_;
  std::map<std::uint64_t, std::uint64_t> free_by_addr_;           // addr -> size
  std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_size_;  // (size, addr)
  std::map<std::uint64_t, block> live_;
  std::vector<block> retired_;
  std::uint64_t live_bytes_ = 0;
  std::uint64_t retired_bytes_ = 0;
};

}  // namespace vmmckpt
