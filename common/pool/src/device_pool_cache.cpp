// The pool's allocation and free as threads see them: each thread's cache of its freed small blocks and
// the live index sharded by address, so that the common allocate/free pair takes no pool-wide lock.
#include <algorithm>
#include <map>

#include "vmmckpt/pool/device_pool.hpp"

namespace vmmckpt {

// Every cache of one thread, one per pool it used. When the thread ends, its blocks go back to their
// pools (bookkeeping only: no driver call from a thread's exit; the pool's next free or allocation
// gives back handles as usual).
struct device_pool::thread_caches {
  std::vector<std::shared_ptr<thread_cache>> caches;
  thread_cache* last = nullptr;  // the one used last: usually the only one

  thread_caches() = default;
  thread_caches(const thread_caches&) = delete;
  thread_caches& operator=(const thread_caches&) = delete;
  ~thread_caches() {
    for (const auto& cache : caches) {
      std::lock_guard lock(cache->mutex);
      if (cache->pool == nullptr) continue;
      {
        std::lock_guard pool_lock(cache->pool->mutex_);
        cache->pool->give_back_locked(*cache, cache->blocks.size());
      }
      cache->pool = nullptr;
      cache->gone.store(true, std::memory_order_release);
    }
  }
};

device_pool::~device_pool() {
  // Threads may outlive the pool: their caches forget it (a later pool never has its id).
  std::lock_guard lock(caches_mutex_);
  for (const auto& cache : caches_) {
    std::lock_guard cache_lock(cache->mutex);
    cache->pool = nullptr;
    cache->blocks.clear();
    cache->bytes = 0;
    cache->gone.store(true, std::memory_order_release);
  }
}

device_pool::live_shard& device_pool::shard_for(std::uint64_t addr) const {
  // Fibonacci hashing of the 512-byte unit: neighbouring blocks land in different shards.
  return shards_[((addr >> 9) * 0x9E3779B97F4A7C15ULL) >> (64 - shard_bits)];
}

void device_pool::index_insert(std::uint64_t addr, std::uint64_t requested, std::uint32_t tag) {
  live_shard& shard = shard_for(addr);
  std::lock_guard lock(shard.mutex);
  shard.blocks.emplace(addr, live_block{requested, tag});
  shard.bytes += range_allocator::rounded_size(requested);
  ++shard.changes;
}

void device_pool::index_reinsert(live_map::node_type& node) {
  live_shard& shard = shard_for(node.key());
  std::lock_guard lock(shard.mutex);
  shard.bytes += range_allocator::rounded_size(node.mapped().requested);
  shard.blocks.insert(std::move(node));
  ++shard.changes;
}

device_pool::live_map::node_type device_pool::index_extract(std::uint64_t addr) {
  live_shard& shard = shard_for(addr);
  std::lock_guard lock(shard.mutex);
  live_map::node_type node = shard.blocks.extract(addr);
  if (!node.empty()) {
    shard.bytes -= range_allocator::rounded_size(node.mapped().requested);
    ++shard.changes;
  }
  return node;
}

bool device_pool::cacheable(std::uint64_t size) const {
  return policy_.cache_blocks != 0 && size <= policy_.cache_max_block && size <= policy_.cache_bytes &&
         size <= (1ULL << 40);  // whatever the policy says, rounding such a size cannot overflow
}

device_pool::thread_cache* device_pool::this_thread_cache() {
  thread_local thread_caches mine;
  if (mine.last != nullptr && mine.last->pool_id == id_) return mine.last;
  for (const auto& cache : mine.caches)
    if (cache->pool_id == id_) return mine.last = cache.get();
  // This thread's first call on this pool. Caches of pools that are gone are dropped here.
  mine.last = nullptr;
  std::erase_if(mine.caches, [](const auto& c) { return c->gone.load(std::memory_order_acquire); });
  auto cache = std::make_shared<thread_cache>(id_, this);
  cache->blocks.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(policy_.cache_blocks, 1024)) + 1);
  {
    std::lock_guard lock(caches_mutex_);
    std::erase_if(caches_, [](const auto& c) { return c->gone.load(std::memory_order_acquire); });
    caches_.push_back(cache);
  }
  mine.caches.push_back(cache);
  return mine.last = cache.get();
}

// A cached block may be handed out again without waiting when a synchronize that began after its free
// has completed, or when the last completed one began with the work count the free saw (no work was
// submitted between that synchronize's start and the free). The same rule as the quarantine's.
bool device_pool::reusable(const cached_block& b) const {
  return b.work == synced_work_.load(std::memory_order_seq_cst) ||
         syncs_done_.load(std::memory_order_seq_cst) > b.began;
}

bool device_pool::take_cached(thread_cache& cache, std::uint64_t rounded, std::uint64_t requested, alloc_api api,
                              std::uint64_t& addr) {
  // The most recently freed block of exactly this size. Which block is taken depends only on the
  // thread's own calls; whether a synchronize comes first decides nothing about placement.
  const auto it = std::find_if(cache.blocks.rbegin(), cache.blocks.rend(),
                               [&](const cached_block& b) { return b.size == rounded; });
  if (it == cache.blocks.rend()) return false;
  if (!reusable(*it)) {
    std::lock_guard lock(mutex_);
    if (!reusable(*it)) {
      synchronize_locked();
      ranges_.reclaim_retired();  // the synchronize covers the quarantine too
    }
  }
  live_map::node_type node = std::move(it->node);
  addr = node.key();
  node.mapped() = live_block{requested, static_cast<std::uint32_t>(api)};
  {
    live_shard& shard = shard_for(addr);
    std::lock_guard lock(shard.mutex);
    shard.bytes += rounded;
    shard.blocks.insert(std::move(node));
    ++shard.changes;
  }
  cache.bytes -= rounded;
  cache.blocks.erase(std::next(it).base());
  return true;
}

void device_pool::give_back_locked(thread_cache& cache, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const cached_block& b = cache.blocks[i];
    const std::uint64_t addr = b.node.key();
    if (reusable(b)) {
      ranges_.release(addr);
    } else {
      // Work submitted before its free may still run: the quarantine's rule from here on.
      ranges_.retire(addr);
      retired_work_ = backend_.submitted_work();
    }
    count_live(addr, b.size, false);
    cache.bytes -= b.size;
  }
  cache.blocks.erase(cache.blocks.begin(), cache.blocks.begin() + static_cast<std::ptrdiff_t>(count));
}

std::size_t device_pool::flush_caches() {
  std::size_t given = 0;
  std::lock_guard lock(caches_mutex_);
  for (const auto& cache : caches_) {
    std::lock_guard cache_lock(cache->mutex);
    if (cache->pool == nullptr || cache->blocks.empty()) continue;
    std::lock_guard pool_lock(mutex_);
    given += cache->blocks.size();
    give_back_locked(*cache, cache->blocks.size());
  }
  return given;
}

pool_status device_pool::allocate(std::uint64_t size, alloc_api api, std::uint64_t& addr, int* backend_error) {
  if (size == 0) return pool_status::invalid_value;
  if (cacheable(size)) {
    thread_cache* cache = this_thread_cache();
    std::lock_guard lock(cache->mutex);
    const std::uint64_t rounded = range_allocator::rounded_size(size);
    if (std::find(cache->recent_sizes.begin(), cache->recent_sizes.end(), rounded) == cache->recent_sizes.end()) {
      cache->recent_sizes[cache->recent_next] = rounded;
      cache->recent_next = (cache->recent_next + 1) % cache->recent_sizes.size();
    }
    if (take_cached(*cache, rounded, size, api, addr)) return pool_status::ok;
  }
  pool_status status = allocate_locked(size, api, addr, backend_error);
  // Before an allocation fails, the blocks kept in threads' caches go back to the pool and it is tried
  // once more (the quarantine's synchronize and the giving back of idle handles follow as usual).
  if (status == pool_status::out_of_memory && flush_caches() != 0)
    status = allocate_locked(size, api, addr, backend_error);
  return status;
}

// Retires a block whose index entry was taken out; when retiring throws (no memory) before the block
// left the placement, the entry goes back (a node needs no allocation), so the block stays live and
// the free can be tried again.
void device_pool::retire_or_restore_locked(std::uint64_t addr, live_map::node_type& node) {
  try {
    retire_locked(addr);
  } catch (...) {
    if (ranges_.is_live(addr)) index_reinsert(node);
    throw;
  }
}

pool_status device_pool::free(std::uint64_t addr) {
  if (policy_.cache_blocks == 0 || policy_.cache_bytes == 0) {
    std::lock_guard lock(mutex_);
    live_map::node_type node = index_extract(addr);
    if (node.empty()) return pool_status::invalid_value;
    retire_or_restore_locked(addr, node);
    return pool_status::ok;
  }
  thread_cache* cache = this_thread_cache();
  // Held until the block is in the cache or the quarantine, so that whoever holds every lock (a
  // check, fork) never sees it in neither.
  std::lock_guard cache_lock(cache->mutex);
  live_map::node_type node = index_extract(addr);
  if (node.empty()) return pool_status::invalid_value;  // not live: double, interior or foreign
  const std::uint64_t requested = node.mapped().requested;
  const std::uint64_t rounded = cacheable(requested) ? range_allocator::rounded_size(requested) : 0;
  if (rounded == 0 ||
      std::find(cache->recent_sizes.begin(), cache->recent_sizes.end(), rounded) == cache->recent_sizes.end()) {
    std::lock_guard lock(mutex_);
    retire_or_restore_locked(addr, node);
    return pool_status::ok;
  }
  const std::uint64_t began = syncs_begun_.load(std::memory_order_seq_cst);
  const std::uint64_t work = backend_.submitted_work();
  cache->blocks.push_back(cached_block{std::move(node), rounded, work, began});
  cache->bytes += rounded;
  if (cache->blocks.size() > policy_.cache_blocks || cache->bytes > policy_.cache_bytes) {
    // Over a bound: the oldest blocks go back to the pool until the cache is at half of both, so a
    // thread that frees what others allocated takes the pool's lock once per several frees.
    std::size_t count = 0;
    std::uint64_t bytes = cache->bytes;
    while (count < cache->blocks.size() &&
           (cache->blocks.size() - count > policy_.cache_blocks / 2 || bytes > policy_.cache_bytes / 2))
      bytes -= cache->blocks[count++].size;
    std::lock_guard lock(mutex_);
    give_back_locked(*cache, count);
    release_over_retain_locked();
  }
  return pool_status::ok;
}

// A shard's lock is only ever taken by a thread that holds its cache's lock or the pool's (and a thread
// gets a cache only under caches_mutex_): holding all of those, no other thread holds a shard's lock or
// can take one, so the live index cannot change and a fork() leaves every shard's lock free. Holding
// the shards' locks too would take more locks at once than ThreadSanitizer can follow (64).
void device_pool::lock_everything() const {
  caches_mutex_.lock();
  for (const auto& cache : caches_) cache->mutex.lock();
  mutex_.lock();
}

void device_pool::unlock_everything() const {
  mutex_.unlock();
  for (auto it = caches_.rbegin(); it != caches_.rend(); ++it) (*it)->mutex.unlock();
  caches_mutex_.unlock();
}

void device_pool::hold_for_fork() const { lock_everything(); }
void device_pool::release_after_fork() const { unlock_everything(); }

// Each live block is in its address's shard, and each shard's byte count is its blocks'; their ranges into
// `held`.
std::string device_pool::check_live_index(held_ranges& held) const {
  for (const live_shard& shard : shards_) {
    std::lock_guard lock(shard.mutex);  // nobody else can hold it (see lock_everything)
    std::uint64_t bytes = 0;
    for (const auto& [addr, b] : shard.blocks) {
      if (&shard_for(addr) != &shard) return "live index: a block is in another address's shard";
      if (b.requested == 0) return "live index: a block of size 0";
      bytes += range_allocator::rounded_size(b.requested);
      held.emplace(addr, range_allocator::rounded_size(b.requested));
    }
    if (bytes != shard.bytes) return "live index: a shard's byte count is wrong";
  }
  return {};
}

// A thread's cache holds blocks of this pool only, each once and in no other place, within its bounds;
// their ranges into `held`.
std::string device_pool::check_cache_locked(const thread_cache& cache, held_ranges& held) const {
  if (cache.pool == nullptr)
    return cache.blocks.empty() ? "" : "thread cache: a cache of a pool or thread that is gone holds blocks";
  if (cache.pool != this) return "thread cache: a cache names another pool";
  std::uint64_t bytes = 0;
  for (const cached_block& b : cache.blocks) {
    if (b.node.empty()) return "thread cache: a cached block has no index node";
    if (!cacheable(b.size) && !cacheable(b.node.mapped().requested)) return "thread cache: a block too large";
    if (!held.emplace(b.node.key(), b.size).second) return "thread cache: a cached block is also live or cached twice";
    bytes += b.size;
  }
  if (bytes != cache.bytes) return "thread cache: the byte count is wrong";
  if (cache.blocks.size() > policy_.cache_blocks || cache.bytes > policy_.cache_bytes)
    return "thread cache: over its bounds";
  return {};
}

// Every range taken in placement is exactly one live block or one cached block, of the same size.
std::string device_pool::check_caches_locked() const {
  held_ranges held;
  if (std::string why = check_live_index(held); !why.empty()) return why;
  for (const auto& cache : caches_)
    if (std::string why = check_cache_locked(*cache, held); !why.empty()) return why;
  const auto taken = ranges_.live_blocks();
  const auto same = [](const auto& block, const auto& range) {
    return block.addr == range.first && block.size == range.second;
  };
  if (!std::equal(taken.begin(), taken.end(), held.begin(), held.end(), same))
    return "the ranges taken in placement are not the live and cached blocks";
  return {};
}

}  // namespace vmmckpt
