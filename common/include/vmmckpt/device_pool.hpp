// One device's pool: placement of blocks plus the physical memory under them.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>

#include "vmmckpt/adaptive_mutex.hpp"
#include <string>
#include <vector>

#include "vmmckpt/alloc_api.hpp"
#include "vmmckpt/range_allocator.hpp"

namespace vmmckpt {

// What the pool needs from the driver. The shim implements it with cuMemCreate
// and friends; unit tests implement it with a simulated address space.
class physical_backend {
 public:
  virtual ~physical_backend() = default;
  // Backs [addr, addr + size) (granularity-aligned) with one new physical
  // handle, mapped and accessible. Returns 0 or a driver error code; `handle`
  // is the backend's own token for the segment.
  virtual int map_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t& handle) = 0;
  virtual void unmap_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t handle) = 0;
  // Waits until no work submitted so far can touch pool memory.
  virtual void synchronize() = 0;
  // A count that moves with every piece of GPU work the program submits (it may wrap): while it
  // has not moved since a synchronize began, freed memory can be reused without waiting again.
  virtual std::uint64_t submitted_work() const = 0;
  virtual bool is_out_of_memory(int error) const = 0;
};

enum class pool_status { ok, out_of_memory, invalid_value, backend_error };

struct pool_policy {
  std::uint64_t granularity = 2ULL << 20;   // physical handle granularity
  std::uint64_t growth_step = 64ULL << 20;  // least physical memory added at once
  std::uint64_t retain_bytes = 256ULL << 20;  // wholly free (idle) handles kept mapped, at most
  // Idle handles are kept only while they may be used again soon: one that this many allocations
  // in a row did not use is given back, and so is, oldest first, as much idle memory as an
  // allocation had to map anew.
  std::uint64_t retain_allocations = 16;
};

struct pool_stats {
  std::uint64_t live_bytes = 0;
  std::uint64_t live_count = 0;
  std::uint64_t quarantined_bytes = 0;
  std::uint64_t backed_bytes = 0;
  std::uint64_t idle_segment_bytes = 0;  // handles with no live block at all
  std::uint64_t segment_count = 0;
  std::uint64_t largest_free = 0;
};

struct segment_info {
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t handle;
};

// Thread-safe. Freed blocks are quarantined: their range is reused only after
// the backend synchronized, so memory is never handed out again while work
// submitted before the free may still touch it. The synchronization happens at
// the next allocation after a free (or when idle handles are trimmed), not at
// every free. Placement is the range_allocator's and so deterministic.
class device_pool {
 public:
  device_pool(std::uint64_t base, std::uint64_t size, const pool_policy& policy, physical_backend& backend);
  ~device_pool() = default;
  device_pool(const device_pool&) = delete;
  device_pool& operator=(const device_pool&) = delete;

  // size must be non-zero (callers answer size 0 the way their API does).
  pool_status allocate(std::uint64_t size, alloc_api api, std::uint64_t& addr, int* backend_error = nullptr);
  // invalid_value when addr is not the start of a live block.
  pool_status free(std::uint64_t addr);

  // Restoring an image: a block live at exactly addr, with physical memory
  // under it (invalid_value when the range is not free).
  pool_status restore_block(std::uint64_t addr, std::uint64_t size, alloc_api api, int* backend_error = nullptr);
  // Replaying an image: physical memory under [addr, addr + size) but no live
  // block; the program's own allocations will land there again. Such memory
  // is kept (never trimmed as idle) until the program has allocated it.
  pool_status prefill(std::uint64_t addr, std::uint64_t size, int* backend_error = nullptr);

  bool contains(std::uint64_t addr) const { return addr - base_ < size_; }
  // The live block containing addr (base and the size the caller asked for).
  bool address_range(std::uint64_t addr, std::uint64_t& block_base, std::uint64_t& block_size) const;

  pool_stats stats() const;
  std::vector<range_allocator::block> live_blocks() const;
  std::vector<segment_info> segments() const;

  // Suspend: gives back every physical handle, live blocks' included, after a
  // synchronize. The address range stays reserved and every block stays
  // allocated, so resume puts the same memory back at the same addresses.
  // Returns the bytes given back. The caller keeps the program off the pool.
  std::uint64_t release_all_physical();
  // Resume: physical memory under every live block again (contents are the
  // caller's to restore). On failure everything created is given back.
  pool_status rebuild_physical(int* backend_error = nullptr);

  // Waits until no work submitted so far can touch the pool (a dump's snapshot point).
  void synchronize() { backend_.synchronize(); }

  // Synchronizes, reuses quarantined ranges and gives back every wholly free
  // handle (used when the driver runs out of memory, and by tests).
  void trim();

  std::uint64_t base() const { return base_; }
  std::uint64_t size() const { return size_; }

  // Checks the placement and the physical memory agree with each other (for
  // tests and `cuda-ckpt check`); an empty string when they do, else what is wrong.
  std::string check_invariants() const;

  // fork(): held across it so the child never inherits a lock taken by another thread.
  void hold_for_fork() const { mutex_.lock(); }
  void release_after_fork() const { mutex_.unlock(); }

 private:
  struct segment {
    std::uint64_t size;
    std::uint64_t handle;
    std::uint64_t live;        // bytes of live blocks inside this segment
    std::uint64_t idle_since;  // allocations_ when it last became idle
  };
  using segment_map = std::map<std::uint64_t, segment>;

  // may_release_idle: the quarantine is empty, so idle handles may be given back at once.
  int back_range(std::uint64_t addr, std::uint64_t size, bool may_release_idle = false);
  void count_live(std::uint64_t addr, std::uint64_t size, bool add);
  void reclaim_locked();
  void synchronize_locked();  // backend_.synchronize(), remembering how much work it covered
  void release_idle_locked(std::uint64_t keep_bytes);
  void release_aged_locked();
  segment_map::iterator add_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t handle);
  segment_map::iterator drop_segment(segment_map::iterator it);  // unmaps an idle segment

  const std::uint64_t base_;
  const std::uint64_t size_;
  const pool_policy policy_;
  physical_backend& backend_;

  mutable adaptive_mutex mutex_;
  range_allocator ranges_;
  segment_map segments_;  // by start address
  std::set<std::pair<std::uint64_t, std::uint64_t>> idle_order_;  // (idle_since, addr) of idle segments
  std::uint64_t allocations_ = 0;
  std::uint64_t backed_bytes_ = 0;
  std::uint64_t idle_bytes_ = 0;
  bool keep_idle_ = false;  // set by prefill
  bool suspended_ = false;  // between release_all_physical and rebuild_physical
  std::uint64_t retired_work_ = 0;  // submitted_work() at the latest free
  std::uint64_t synced_work_ = 0;   // submitted_work() when the last synchronize began
};

}  // namespace vmmckpt
