// Deterministic placement of blocks inside one pool's address range (no memory is touched).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt {

// Segregated best fit, lowest address among equal fits, with coalescing.
//
// Small blocks (rounded size under small_block_limit) are placed only in
// small-block chunks: stretches of small_chunk_size on a grid from the base. A
// small block goes best fit into the free space of the chunks already holding
// small blocks; when none fits, the best-fitting wholly free chunk becomes one.
// Other blocks go best fit into the space outside those chunks. So small blocks
// lie packed together (a few physical handles serve them all) and no larger block
// shares a 2 MiB granule with another block (its memory can go back when it is
// freed). A request fails only when no free range fits: with no chunk wholly
// free, a small block goes best fit outside the chunks (and its own chunk becomes
// a small-block chunk); a larger block that fits nowhere outside goes into a
// chunk's free space.
//
// A chunk is a small-block chunk exactly while a small block (live or retired)
// touches it, and free ranges are maximal within each such chunk and outside
// them. The whole state is therefore a pure function of the set of blocks, and
// the address a request receives a pure function of the sequence of
// allocate/free calls (or of claims that rebuilt the same blocks, in any order):
// the same in every run, whatever the GPU.
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
  bool is_live(std::uint64_t addr) const { return live_.count(addr) != 0; }
  std::size_t free_range_count() const { return free_by_addr_.size(); }
  std::uint64_t largest_free() const;

  std::vector<block> live_blocks() const;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> free_ranges() const;

  // Verifies the internal structures agree (for tests); returns an empty
  // string when consistent, else what is wrong.
  const char* check_invariants() const;

  static std::uint64_t rounded_size(std::uint64_t requested);
  static std::uint64_t alignment_for(std::uint64_t rounded);
  static bool is_small(std::uint64_t rounded) { return rounded < small_block_limit; }

  // Small-block chunks: how many, and the bounds of the chunk holding addr (the chunk
  // grid is fixed: base + k * small_chunk_size, the last one clipped to the pool).
  std::size_t small_chunk_count() const { return small_chunks_.size(); }
  bool in_small_chunk(std::uint64_t addr) const { return is_small_chunk(chunk_of(addr)); }
  std::uint64_t chunk_begin(std::uint64_t addr) const { return chunk_start(chunk_of(addr)); }
  std::uint64_t chunk_end(std::uint64_t addr) const { return chunk_limit(chunk_of(addr)); }

 private:
  // check_invariants' parts: the free indexes (adding up the free bytes), and the live and retired blocks
  // (counting the blocks in each small-block chunk).
  const char* check_free_ranges(std::uint64_t& free_bytes) const;
  const char* check_blocks(std::map<std::uint64_t, std::uint32_t>& small_counts) const;

  using size_index = std::set<std::pair<std::uint64_t, std::uint64_t>>;  // (size, addr)
  using free_map = std::map<std::uint64_t, std::uint64_t>;               // addr -> size

  std::uint64_t chunk_of(std::uint64_t addr) const { return (addr - base_) / small_chunk_size; }
  std::uint64_t chunk_start(std::uint64_t chunk) const { return base_ + chunk * small_chunk_size; }
  std::uint64_t chunk_limit(std::uint64_t chunk) const;  // end of the chunk, clipped to the pool
  bool is_small_chunk(std::uint64_t chunk) const { return small_chunks_.count(chunk) != 0; }
  size_index& index_at(std::uint64_t addr) { return is_small_chunk(chunk_of(addr)) ? small_free_ : free_by_size_; }

  void insert_free(size_index& index, std::uint64_t addr, std::uint64_t size);
  void erase_free(size_index& index, free_map::iterator it);
  // Best fit in one index: the free range and the aligned start inside it, or nothing.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> find_fit(const size_index& index, std::uint64_t size,
                                                                  std::uint64_t alignment, std::uint64_t origin) const;
  // Takes [start, start + size) out of the free range at range_addr (in `index`).
  void carve(size_index& index, std::uint64_t range_addr, std::uint64_t start, std::uint64_t size);
  // Makes [addr, addr + size) free: split where chunks change, coalesced within each.
  void free_range(std::uint64_t addr, std::uint64_t size);
  void free_piece(std::uint64_t addr, std::uint64_t size, bool small, std::uint64_t chunk);
  // A small block starts or ends touching its chunks.
  void count_small(std::uint64_t addr, std::uint64_t size, bool add);
  void make_small_chunk(std::uint64_t chunk);
  void dissolve_small_chunk(std::uint64_t chunk);
  std::uint64_t place(std::uint64_t start, std::uint64_t size, std::uint64_t requested, std::uint32_t tag);

  std::uint64_t base_;
  std::uint64_t size_;
  free_map free_by_addr_;                                // every free range, both kinds
  size_index free_by_size_;                              // free ranges outside small-block chunks
  size_index small_free_;                                // free ranges inside small-block chunks
  std::map<std::uint64_t, std::uint32_t> small_chunks_;  // chunk index -> small blocks touching it
  std::map<std::uint64_t, block> live_;
  std::vector<block> retired_;
  std::uint64_t live_bytes_ = 0;
  std::uint64_t retired_bytes_ = 0;
};

}  // namespace vmmckpt
