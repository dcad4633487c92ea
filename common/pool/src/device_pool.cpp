// One device's pool: quarantine, growth and trimming of physical memory under the placement.
#include "vmmckpt/pool/device_pool.hpp"

#include <algorithm>

#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt {

namespace {
std::atomic<std::uint64_t> next_pool_id{1};
}

device_pool::device_pool(std::uint64_t base, std::uint64_t size, const pool_policy& policy, physical_backend& backend)
    : base_(base), size_(size), policy_(policy), backend_(backend), ranges_(base, size), id_(next_pool_id++) {}

// Placement and physical memory under the pool's lock: what every allocation the caches cannot serve takes.
pool_status device_pool::allocate_locked(std::uint64_t size, alloc_api api, std::uint64_t& addr, int* backend_error) {
  std::lock_guard lock(mutex_);
  reclaim_locked();
  const auto placed = ranges_.allocate(size, static_cast<std::uint32_t>(api));
  if (!placed) return pool_status::out_of_memory;
  const std::uint64_t occupied = range_allocator::rounded_size(size);

  // Quarantine is empty here (reclaimed above), so every idle handle was last
  // freed before a synchronize: giving them back cannot race with the GPU.
  const std::uint64_t backed_before = backed_bytes_;
  int error = back_range(*placed, occupied, true);
  if (error != 0 && backend_.is_out_of_memory(error)) {
    release_idle_locked(0);
    error = back_range(*placed, occupied, true);
  }
  if (error != 0) {
    ranges_.release(*placed);
    if (backend_error) *backend_error = error;
    return backend_.is_out_of_memory(error) ? pool_status::out_of_memory : pool_status::backend_error;
  }
  count_live(*placed, occupied, true);
  index_insert(*placed, size, static_cast<std::uint32_t>(api));
  ++allocations_;
  if (!keep_idle_) {
    // Memory mapped for this block while idle handles sat unused: give back as much, oldest first.
    std::uint64_t mapped = backed_bytes_ > backed_before ? backed_bytes_ - backed_before : 0;
    while (mapped > 0 && !idle_order_.empty()) {
      auto it = segments_.find(idle_order_.begin()->second);
      mapped -= std::min(mapped, it->second.size);
      drop_segment(it);
    }
    release_aged_locked();
  }
  addr = *placed;
  return pool_status::ok;
}

// A block whose life already ended in the live index goes into the quarantine.
void device_pool::retire_locked(std::uint64_t addr) {
  const auto block = ranges_.retire(addr);
  if (!block) return;  // cannot happen: the live index had it
  // Work submitted until now may still use the block: reusing it waits for that work only.
  retired_work_ = backend_.submitted_work();
  count_live(block->addr, block->size, false);
  release_over_retain_locked();
}

void device_pool::release_over_retain_locked() {
  if (idle_bytes_ > policy_.retain_bytes && !keep_idle_) {
    reclaim_locked();
    release_idle_locked(policy_.retain_bytes);
  }
}

pool_status device_pool::restore_block(std::uint64_t addr, std::uint64_t size, alloc_api api, int* backend_error) {
  std::lock_guard lock(mutex_);
  if (!ranges_.claim(addr, size, static_cast<std::uint32_t>(api))) return pool_status::invalid_value;
  const std::uint64_t occupied = range_allocator::rounded_size(size);
  const int error = back_range(addr, occupied);
  if (error != 0) {
    ranges_.release(addr);
    if (backend_error) *backend_error = error;
    return backend_.is_out_of_memory(error) ? pool_status::out_of_memory : pool_status::backend_error;
  }
  count_live(addr, occupied, true);
  index_insert(addr, size, static_cast<std::uint32_t>(api));
  return pool_status::ok;
}

pool_status device_pool::prefill(std::uint64_t addr, std::uint64_t size, int* backend_error) {
  std::lock_guard lock(mutex_);
  if (addr < base_ || addr - base_ + size > size_) return pool_status::invalid_value;
  const int error = back_range(addr, size);
  if (error != 0) {
    if (backend_error) *backend_error = error;
    return backend_.is_out_of_memory(error) ? pool_status::out_of_memory : pool_status::backend_error;
  }
  keep_idle_ = true;  // the replayed bytes must survive until allocated again
  return pool_status::ok;
}

std::uint64_t device_pool::release_all_physical() {
  std::lock_guard lock(mutex_);
  synchronize_locked();
  ranges_.reclaim_retired();
  const std::uint64_t released = backed_bytes_;
  for (const auto& [addr, seg] : segments_) backend_.unmap_segment(addr, seg.size, seg.handle);
  segments_.clear();
  idle_order_.clear();
  backed_bytes_ = 0;
  idle_bytes_ = 0;
  suspended_ = true;
  return released;
}

pool_status device_pool::rebuild_physical(int* backend_error) {
  std::lock_guard lock(mutex_);
  int error = rebuild_locked();
  if (error != 0 && backend_.is_out_of_memory(error)) {
    // The growth steps of the first small blocks may hold memory that later blocks need: once more,
    // with memory under each block alone.
    grow_exactly_ = true;
    error = rebuild_locked();
    grow_exactly_ = false;
  }
  if (error != 0) {
    if (backend_error) *backend_error = error;
    return backend_.is_out_of_memory(error) ? pool_status::out_of_memory : pool_status::backend_error;
  }
  for (const auto& b : ranges_.live_blocks()) count_live(b.addr, b.size, true);
  suspended_ = false;
  return pool_status::ok;
}

// Memory under every taken range; on failure nothing stays mapped.
int device_pool::rebuild_locked() {
  for (const auto& b : ranges_.live_blocks()) {
    const int error = back_range(b.addr, b.size);
    if (error != 0) {
      for (const auto& [addr, seg] : segments_) backend_.unmap_segment(addr, seg.size, seg.handle);
      segments_.clear();
      idle_order_.clear();
      backed_bytes_ = idle_bytes_ = 0;
      return error;
    }
  }
  return 0;
}

bool device_pool::address_range(std::uint64_t addr, std::uint64_t& block_base, std::uint64_t& block_size) const {
  std::lock_guard lock(mutex_);
  // The range taken around addr; a block in a thread's cache is taken but not live.
  const auto* block = ranges_.find(addr);
  if (!block) return false;
  live_shard& shard = shard_for(block->addr);
  std::lock_guard shard_lock(shard.mutex);
  const auto it = shard.blocks.find(block->addr);
  if (it == shard.blocks.end()) return false;
  block_base = block->addr;
  block_size = it->second.requested;
  return true;
}

std::string device_pool::check_invariants() const {
  lock_everything();
  struct unlock {
    const device_pool* pool;
    ~unlock() { pool->unlock_everything(); }
  } unlock_at_end{this};
  if (const char* why = ranges_.check_invariants(); *why != '\0') return std::string("placement: ") + why;
  if (std::string why = check_caches_locked(); !why.empty()) return why;
  std::uint64_t backed = 0, idle = 0, prev_end = 0;
  for (const auto& [addr, seg] : segments_) {
    if (addr < prev_end) return "physical memory: segments overlap";
    if (addr < base_ || addr + seg.size > base_ + size_) return "physical memory: a segment lies outside the pool";
    prev_end = addr + seg.size;
    backed += seg.size;
    if (seg.live == 0) idle += seg.size;
    if ((seg.live == 0) != (idle_order_.count({seg.idle_since, addr}) != 0))
      return "physical memory: the idle order is wrong";
  }
  if (backed != backed_bytes_) return "physical memory: the backed byte count is wrong";
  if (idle != idle_bytes_) return "physical memory: the idle byte count is wrong";
  if (idle_order_.size() > segments_.size()) return "physical memory: the idle order names unknown segments";
  if (suspended_) return {};  // no physical memory while suspended, by design
  for (const auto& b : ranges_.live_blocks()) {
    std::uint64_t cursor = b.addr;
    while (cursor < b.addr + b.size) {
      auto it = segments_.upper_bound(cursor);
      if (it == segments_.begin()) return "a live block has no physical memory under it";
      --it;
      if (it->first + it->second.size <= cursor) return "a live block has no physical memory under it";
      cursor = it->first + it->second.size;
    }
  }
  return {};
}

pool_stats device_pool::stats() const {
  pool_stats s;
  {
    std::lock_guard lock(caches_mutex_);
    for (const auto& cache : caches_) {
      std::lock_guard cache_lock(cache->mutex);
      s.cached_bytes += cache->bytes;
      s.cached_count += cache->blocks.size();
    }
  }
  std::lock_guard lock(mutex_);
  for (const live_shard& shard : shards_) {
    std::lock_guard shard_lock(shard.mutex);
    s.live_bytes += shard.bytes;
    s.live_count += shard.blocks.size();
  }
  s.quarantined_bytes = ranges_.retired_bytes();
  s.backed_bytes = backed_bytes_;
  s.idle_segment_bytes = idle_bytes_;
  s.segment_count = segments_.size();
  s.largest_free = ranges_.largest_free();
  return s;
}

namespace {

// Blocks sorted by their 512-byte unit above `base`, 11 bits a pass (a 512 GiB pool takes three):
// linear, where a comparison sort of 200 000 blocks takes tens of milliseconds of a hold.
void sort_by_address(std::vector<allocation>& blocks, std::uint64_t base) {
  std::vector<allocation> spare(blocks.size());
  constexpr int digit_bits = 11;
  std::uint64_t top = 0;
  for (const auto& a : blocks) top = std::max(top, (a.addr - base) >> 9);
  for (int shift = 0; (top >> shift) != 0; shift += digit_bits) {
    std::array<std::size_t, (1 << digit_bits) + 1> start{};
    auto digit = [&](const allocation& a) { return (((a.addr - base) >> 9) >> shift) & ((1u << digit_bits) - 1); };
    for (const auto& a : blocks) ++start[digit(a) + 1];
    for (std::size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
    for (const auto& a : blocks) spare[start[digit(a)]++] = a;
    blocks.swap(spare);
  }
}

}  // namespace

std::vector<allocation> device_pool::live_allocations() const {
  // Every shard's lock, in index order, and nothing else: a shard's lock is a leaf (whoever holds one
  // takes no other), so this cannot deadlock, and every change to the live index holds the shard it
  // changes, so the listing is one moment's. The pool's own lock is not needed, and not taken:
  // ThreadSanitizer follows at most 64 locks held at once.
  std::size_t count = 0;
  for (const live_shard& shard : shards_) {
    std::lock_guard shard_lock(shard.mutex);
    count += shard.blocks.size();
  }
  std::vector<allocation> out;
  out.reserve(count);
  // The shards are walked side by side, one entry of each in turn: a hash map's entries are nodes
  // scattered through memory, and walking one map waits on every node's cache miss in turn, while
  // the walks of different maps are independent, so the processor overlaps their misses (several
  // times faster with 200 000 blocks).
  using iterator = live_map::const_iterator;
  std::array<std::pair<iterator, iterator>, std::size_t{1} << shard_bits> walks;
  std::array<std::unique_lock<adaptive_mutex>, std::size_t{1} << shard_bits> shard_locks;
  for (std::size_t s = 0; s < shards_.size(); ++s) {
    shard_locks[s] = std::unique_lock(shards_[s].mutex);
    walks[s] = {shards_[s].blocks.cbegin(), shards_[s].blocks.cend()};
  }
  for (bool more = true; more;) {
    more = false;
    for (auto& [it, end] : walks)
      if (it != end) {
        out.push_back({it->first, it->second.requested, static_cast<alloc_api>(it->second.tag)});
        ++it;
        more = true;
      }
  }
  sort_by_address(out, base_);
  return out;
}

std::vector<allocation> device_pool::live_allocations_unlocked() const {
  // Only a shard's lock at a time (a leaf lock: nothing is taken while it is held).
  std::vector<allocation> out;
  for (const live_shard& shard : shards_) {
    std::lock_guard shard_lock(shard.mutex);
    for (const auto& [addr, b] : shard.blocks) out.push_back({addr, b.requested, static_cast<alloc_api>(b.tag)});
  }
  sort_by_address(out, base_);
  return out;
}

std::uint64_t device_pool::changes() const {
  std::uint64_t n = 0;
  for (const live_shard& shard : shards_) {
    std::lock_guard shard_lock(shard.mutex);
    n += shard.changes;
  }
  return n;
}

std::vector<range_allocator::block> device_pool::live_blocks() const {
  std::vector<range_allocator::block> out;
  for (const auto& a : live_allocations())
    out.push_back({a.addr, range_allocator::rounded_size(a.size), a.size, static_cast<std::uint32_t>(a.api)});
  return out;
}

std::vector<segment_info> device_pool::segments() const {
  std::lock_guard lock(mutex_);
  std::vector<segment_info> out;
  out.reserve(segments_.size());
  for (const auto& [addr, seg] : segments_) out.push_back({addr, seg.size, seg.handle});
  return out;
}

void device_pool::with_segments(const std::function<void(const segment_info&)>& fn) const {
  std::lock_guard lock(mutex_);
  for (const auto& [addr, seg] : segments_) fn({addr, seg.size, seg.handle});
}

void device_pool::trim() {
  flush_caches();
  std::lock_guard lock(mutex_);
  synchronize_locked();
  ranges_.reclaim_retired();
  release_idle_locked(0);
}

void device_pool::reclaim_locked() {
  if (!ranges_.has_retired()) return;
  // An allocate/free loop with no GPU work between (common in allocators' warm-up and in
  // programs that size buffers) reuses memory without a synchronize each time.
  // Every synchronize empties the quarantine, so the blocks in it were all freed since the last
  // one began: if the count has not moved by the latest free, none can be in use.
  if (retired_work_ != synced_work_.load(std::memory_order_relaxed)) synchronize_locked();
  ranges_.reclaim_retired();
}

void device_pool::synchronize_locked() {
  // Counted as begun before the work is read: a cached block whose free saw the count before this
  // increment was freed before this synchronize began, so it covers the block.
  const std::uint64_t number = syncs_begun_.fetch_add(1, std::memory_order_seq_cst) + 1;
  const std::uint64_t work = backend_.submitted_work();
  backend_.synchronize();
  synced_work_.store(work, std::memory_order_seq_cst);
  syncs_done_.store(number, std::memory_order_seq_cst);
}

int device_pool::back_range(std::uint64_t addr, std::uint64_t size, bool may_release_idle) {
  const std::uint64_t granule = policy_.granularity;
  const std::uint64_t want_end = std::min(align_up(addr + size, granule), base_ + size_);
  const bool small = range_allocator::is_small(size);
  const std::uint64_t cursor = align_down(addr, granule);
  const auto it = segments_.upper_bound(cursor);
  if (it != segments_.begin()) {
    // Most small blocks land inside a handle already in use.
    const auto prev = std::prev(it);
    if (prev->second.live != 0 && prev->first + prev->second.size >= want_end) return 0;
  }
  if (may_release_idle && !keep_idle_) drop_idle_beyond(addr, cursor, want_end, small);
  return map_gaps(cursor, want_end, small);
}

void device_pool::drop_idle_beyond(std::uint64_t addr, std::uint64_t cursor, std::uint64_t want_end, bool small) {
  // An idle handle reaching past the block's own stretch (its granules; for a small block, its small-block
  // chunk) is given back rather than reused: the block would keep all of it held, the part it does not use
  // included, for as long as it lives.
  const std::uint64_t own_begin = small ? ranges_.chunk_begin(addr) : cursor;
  const std::uint64_t own_end = small ? ranges_.chunk_end(addr) : want_end;
  auto it = segments_.upper_bound(cursor);
  if (it != segments_.begin() && std::prev(it)->first + std::prev(it)->second.size > cursor) --it;
  while (it != segments_.end() && it->first < want_end) {
    const std::uint64_t seg_end = it->first + it->second.size;
    if (it->second.live == 0 && (it->first < own_begin || seg_end > own_end)) {
      it = drop_segment(it);
    } else {
      ++it;
    }
  }
}

int device_pool::map_gaps(std::uint64_t cursor, std::uint64_t want_end, bool small) {
  const std::uint64_t granule = policy_.granularity;
  const std::uint64_t pool_end = base_ + size_;
  auto it = segments_.upper_bound(cursor);
  if (it != segments_.begin()) {
    auto prev = std::prev(it);
    cursor = std::max(cursor, prev->first + prev->second.size);
  }
  while (cursor < want_end) {
    it = segments_.lower_bound(cursor);
    if (it != segments_.end() && it->first == cursor) {
      cursor += it->second.size;
      continue;
    }
    const std::uint64_t gap_end = it == segments_.end() ? pool_end : it->first;
    const std::uint64_t needed_end = std::min(want_end, gap_end);
    // Small blocks grow the pool by at least one step, within their small-block chunk: fewer,
    // larger handles are much cheaper to map and to grant access to, and the next small blocks
    // land in the slack. Other blocks lie outside those chunks and get handles of their own
    // size: nothing else is placed beside them, so slack would stay held, unused, as long as
    // the block lives.
    const std::uint64_t step = align_up(policy_.growth_step, granule);
    const std::uint64_t grown_end =
        !small || grow_exactly_
            ? needed_end
            : std::min({gap_end, std::max(needed_end, std::min(cursor + step, ranges_.chunk_end(cursor)))});
    std::uint64_t handle = 0;
    std::uint64_t seg_end = grown_end;
    int error = backend_.map_segment(cursor, seg_end - cursor, handle);
    if (error != 0 && grown_end != needed_end && backend_.is_out_of_memory(error)) {
      seg_end = needed_end;
      error = backend_.map_segment(cursor, seg_end - cursor, handle);
    }
    if (error != 0) return error;
    add_segment(cursor, seg_end - cursor, handle);
    cursor = seg_end;
  }
  return 0;
}

void device_pool::count_live(std::uint64_t addr, std::uint64_t size, bool add) {
  const std::uint64_t end = addr + size;
  auto it = segments_.upper_bound(addr);
  if (it != segments_.begin()) --it;
  for (; it != segments_.end() && it->first < end; ++it) {
    segment& seg = it->second;
    const std::uint64_t seg_end = it->first + seg.size;
    if (seg_end <= addr) continue;
    const std::uint64_t overlap = std::min(end, seg_end) - std::max(addr, it->first);
    if (add) {
      if (seg.live == 0) {
        idle_bytes_ -= seg.size;
        idle_order_.erase({seg.idle_since, it->first});
      }
      seg.live += overlap;
    } else {
      seg.live -= overlap;
      if (seg.live == 0) {
        idle_bytes_ += seg.size;
        seg.idle_since = allocations_;
        idle_order_.emplace(seg.idle_since, it->first);
      }
    }
  }
}

void device_pool::release_idle_locked(std::uint64_t keep_bytes) {
  // Highest addresses first: placement prefers low addresses, so low handles
  // are the likeliest to be used again.
  for (auto it = segments_.end(); it != segments_.begin() && idle_bytes_ > keep_bytes;) {
    --it;
    if (it->second.live != 0) continue;
    it = drop_segment(it);
  }
}

void device_pool::release_aged_locked() {
  // Oldest first; an alloc/free loop uses its handle again at once and never gets here.
  while (!idle_order_.empty() && allocations_ - idle_order_.begin()->first >= policy_.retain_allocations)
    drop_segment(segments_.find(idle_order_.begin()->second));
}

device_pool::segment_map::iterator device_pool::add_segment(std::uint64_t addr, std::uint64_t size,
                                                            std::uint64_t handle) {
  // Idle until count_live puts a block in it.
  backed_bytes_ += size;
  idle_bytes_ += size;
  idle_order_.emplace(allocations_, addr);
  return segments_.emplace(addr, segment{size, handle, 0, allocations_}).first;
}

device_pool::segment_map::iterator device_pool::drop_segment(segment_map::iterator it) {
  const segment& seg = it->second;
  backend_.unmap_segment(it->first, seg.size, seg.handle);
  idle_bytes_ -= seg.size;
  backed_bytes_ -= seg.size;
  idle_order_.erase({seg.idle_since, it->first});
  return segments_.erase(it);
}

}  // namespace vmmckpt
