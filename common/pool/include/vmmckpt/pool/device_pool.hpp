// One device's pool: placement of blocks plus the physical memory under them.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "vmmckpt/pool/detail/adaptive_mutex.hpp"
#include "vmmckpt/pool/alloc_api.hpp"
#include "vmmckpt/pool/range_allocator.hpp"

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
  std::uint64_t granularity = 2ULL << 20;     // physical handle granularity
  std::uint64_t growth_step = 64ULL << 20;    // least physical memory added at once
  std::uint64_t retain_bytes = 256ULL << 20;  // wholly free (idle) handles kept mapped, at most
  // Idle handles are kept only while they may be used again soon: one that this many allocations
  // in a row did not use is given back, and so is, oldest first, as much idle memory as an
  // allocation had to map anew.
  std::uint64_t retain_allocations = 16;
  // Each thread's cache of its freed small blocks (docs/pool.md): blocks of at most cache_max_block
  // bytes, at most cache_blocks of them and cache_bytes in all, per thread and pool. 0 bytes: none.
  std::uint64_t cache_bytes = 2ULL << 20;
  std::uint64_t cache_max_block = 1ULL << 20;
  std::uint64_t cache_blocks = 8;
};

struct pool_stats {
  std::uint64_t live_bytes = 0;
  std::uint64_t live_count = 0;
  std::uint64_t quarantined_bytes = 0;
  std::uint64_t backed_bytes = 0;
  std::uint64_t idle_segment_bytes = 0;  // handles with no live block at all
  std::uint64_t segment_count = 0;
  std::uint64_t largest_free = 0;
  std::uint64_t cached_bytes = 0;  // freed blocks kept by threads' caches (not live, not reusable by others)
  std::uint64_t cached_count = 0;
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
//
// Small freed blocks first go to a cache of the freeing thread's, from which that thread's next
// allocation of the same rounded size takes them without the pool's lock (under the same rule: a
// synchronize first when work submitted before the free may still run). Liveness is kept in an index
// sharded by address, so that a free is checked (double, interior, foreign) without the pool's lock.
class device_pool {
 public:
  device_pool(std::uint64_t base, std::uint64_t size, const pool_policy& policy, physical_backend& backend);
  ~device_pool();
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
  // Every block the program holds (not the caches'), in address order: what a dump records. A
  // consistent snapshot, taken with every shard locked (the program held, or blocked from
  // allocating meanwhile): 200 000 blocks in about 20 ms.
  std::vector<allocation> live_allocations() const;
  // The same, listed a shard at a time, so that the program allocates on meanwhile (for a listing
  // made ahead of a hold). Consistent only if changes() is the same before and after.
  std::vector<allocation> live_allocations_unlocked() const;
  // Blocks put in or taken out of the live index so far: equal counts, nothing changed between.
  std::uint64_t changes() const;
  std::vector<range_allocator::block> live_blocks() const;  // the same, with their rounded sizes
  std::vector<segment_info> segments() const;
  // Calls fn for every segment with the pool's lock held, so that no segment is mapped or unmapped
  // meanwhile (granting a device access to all of the pool's memory, now and later, races nothing).
  void with_segments(const std::function<void(const segment_info&)>& fn) const;

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

  // Empties every thread's cache, synchronizes, reuses quarantined ranges and gives back every
  // wholly free handle (used by tests; running out of memory does the same).
  void trim();

  std::uint64_t base() const { return base_; }
  std::uint64_t size() const { return size_; }

  // Checks the placement and the physical memory agree with each other (for
  // tests and `cuda-ckpt check`); an empty string when they do, else what is wrong.
  std::string check_invariants() const;

  // fork(): held across it so the child never inherits a lock taken by another thread (the caches'
  // and the pool's own; the live index's locks are only ever taken under one of those, so none is held).
  void hold_for_fork() const;
  void release_after_fork() const;

 private:
  // The live index: every block the program holds, by address, with what it asked for.
  struct live_block {
    std::uint64_t requested;
    std::uint32_t tag;
  };
  using live_map = std::unordered_map<std::uint64_t, live_block>;
  struct alignas(128) live_shard {
    mutable adaptive_mutex mutex;
    live_map blocks;
    std::uint64_t bytes = 0;    // rounded sizes
    std::uint64_t changes = 0;  // blocks put in or taken out, ever
  };
  static constexpr int shard_bits =
      6;  // live_allocations() holds every shard's lock: at most 64 (ThreadSanitizer's limit)
  // A freed block in a thread's cache: still taken in ranges_ and counted live in its segment, but no
  // longer in the live index. Its index node is kept for the block's next life.
  struct cached_block {
    live_map::node_type node;
    std::uint64_t size;   // rounded
    std::uint64_t work;   // backend_.submitted_work() at the free
    std::uint64_t began;  // syncs_begun_ at the free
  };
  // One thread's cache for this pool. Its mutex is taken by its thread on every small allocation and
  // free (never contended then) and by other threads only to flush it, to check it, or around fork().
  struct thread_cache {
    thread_cache(std::uint64_t id, device_pool* owner) : pool_id(id), pool(owner) {}
    const std::uint64_t pool_id;
    mutable std::mutex mutex;
    device_pool* pool;                 // null once the pool or the thread is gone
    std::atomic<bool> gone{false};     // the same, read without the mutex
    std::vector<cached_block> blocks;  // oldest first
    std::uint64_t bytes = 0;
    // The rounded sizes of the thread's latest small allocations (0: none yet): only blocks of these
    // sizes are kept, since only they are likely to be asked for again soon. Blocks of sizes the
    // thread does not allocate again go straight back, so a pattern that seldom repeats a size is
    // placed, and holds memory, much as it would be without caches.
    std::array<std::uint64_t, 16> recent_sizes{};
    std::size_t recent_next = 0;
  };
  struct thread_caches;  // every cache of one thread

  // Lock order: caches_mutex_, then thread caches' mutexes (in caches_ order), then mutex_, then one
  // shard's. A shard's is a leaf: whoever holds one takes no other lock, except live_allocations(),
  // which takes every shard's in index order and nothing else. A thread's fast path takes its own
  // cache's mutex, then one shard's.
  live_shard& shard_for(std::uint64_t addr) const;
  void index_insert(std::uint64_t addr, std::uint64_t requested, std::uint32_t tag);
  live_map::node_type index_extract(std::uint64_t addr);
  void index_reinsert(live_map::node_type& node);  // an extracted entry back; allocates nothing
  void retire_or_restore_locked(std::uint64_t addr, live_map::node_type& node);
  thread_cache* this_thread_cache();
  bool take_cached(thread_cache& cache, std::uint64_t rounded, std::uint64_t requested, alloc_api api,
                   std::uint64_t& addr);
  bool reusable(const cached_block& b) const;
  void give_back_locked(thread_cache& cache, std::size_t count);  // its oldest `count` blocks
  std::size_t flush_caches();
  bool cacheable(std::uint64_t size) const;
  std::string check_caches_locked() const;
  using held_ranges = std::map<std::uint64_t, std::uint64_t>;  // address -> rounded size, for the checks
  std::string check_live_index(held_ranges& held) const;
  std::string check_cache_locked(const thread_cache& cache, held_ranges& held) const;
  void lock_everything() const;
  void unlock_everything() const;

  pool_status allocate_locked(std::uint64_t size, alloc_api api, std::uint64_t& addr, int* backend_error);
  void retire_locked(std::uint64_t addr);
  void release_over_retain_locked();
  struct segment {
    std::uint64_t size;
    std::uint64_t handle;
    std::uint64_t live;        // bytes of live blocks inside this segment
    std::uint64_t idle_since;  // allocations_ when it last became idle
  };
  using segment_map = std::map<std::uint64_t, segment>;

  // may_release_idle: the quarantine is empty, so idle handles may be given back at once.
  int back_range(std::uint64_t addr, std::uint64_t size, bool may_release_idle = false);
  // back_range's parts: giving back idle handles that reach past a new block's own stretch, and mapping
  // handles over the gaps in [cursor, want_end).
  void drop_idle_beyond(std::uint64_t addr, std::uint64_t cursor, std::uint64_t want_end, bool small);
  int map_gaps(std::uint64_t cursor, std::uint64_t want_end, bool small);
  int rebuild_locked();
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
  segment_map segments_;                                          // by start address
  std::set<std::pair<std::uint64_t, std::uint64_t>> idle_order_;  // (idle_since, addr) of idle segments
  std::uint64_t allocations_ = 0;
  std::uint64_t backed_bytes_ = 0;
  std::uint64_t idle_bytes_ = 0;
  bool keep_idle_ = false;          // set by prefill
  bool suspended_ = false;          // between release_all_physical and rebuild_physical
  bool grow_exactly_ = false;       // no growth steps: a resume's second try when memory is short
  std::uint64_t retired_work_ = 0;  // submitted_work() at the latest free
  // Written under mutex_, read without it by the caches.
  std::atomic<std::uint64_t> synced_work_{0};  // submitted_work() when the last synchronize began
  std::atomic<std::uint64_t> syncs_begun_{0};
  std::atomic<std::uint64_t> syncs_done_{0};

  const std::uint64_t id_;  // never reused, unlike the address: threads find their cache by it
  mutable std::mutex caches_mutex_;
  std::vector<std::shared_ptr<thread_cache>> caches_;
  mutable std::array<live_shard, 1 << shard_bits> shards_;
};

}  // namespace vmmckpt
