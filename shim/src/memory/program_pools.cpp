// Memory pools the program creates, served by the shim's pools: the record of each served pool (its device,
// its maxSize, what is taken from it) and of which pointers came from which.
#include "memory/program_pools.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "memory/pools.hpp"
#include "vmmckpt/support/log.hpp"

namespace vmmckpt::detail {
namespace {

struct served_pool {
  int device = 0;
  std::uint64_t max_size = 0;  // 0: no limit but the device's memory
  std::uint64_t used = 0;      // bytes of live allocations from it
  std::uint64_t used_high = 0;
  bool destroyed = false;  // the record goes with its last allocation
  bool by_nccl = false;
};

struct pool_table {
  std::mutex mutex;
  std::unordered_map<CUmemoryPool, served_pool> pools;
  std::unordered_map<std::uint64_t, std::pair<CUmemoryPool, std::uint64_t>> taken;  // pointer -> (pool, bytes)
};


pool_table& table() {
  static pool_table* t = new pool_table;  // never destroyed: frees may come during exit
  return *t;
}

}  // namespace

bool servable_pool(const CUmemPoolProps& props) {
  return props.allocType == CU_MEM_ALLOCATION_TYPE_PINNED && props.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         props.handleTypes == CU_MEM_HANDLE_TYPE_NONE && props.location.id >= 0 && props.location.id < max_devices;
}

void note_program_pool(CUmemoryPool pool, const CUmemPoolProps& props, bool by_nccl) noexcept {
  try {
    pool_table& t = table();
    std::lock_guard lock(t.mutex);
    t.pools[pool] = served_pool{props.location.id, props.maxSize, 0, 0, false, by_nccl};
  } catch (...) {
    log::warn("no memory to record a memory pool of device {}: its allocations pass through", props.location.id);
  }
}

void forget_program_pool(CUmemoryPool pool) noexcept {
  try {
    pool_table& t = table();
    std::lock_guard lock(t.mutex);
    const auto it = t.pools.find(pool);
    if (it == t.pools.end()) return;
    if (it->second.used == 0)
      t.pools.erase(it);
    else
      it->second.destroyed = true;
  } catch (...) {
    // No memory for the table: no pool was ever recorded in it.
  }
}

std::optional<CUresult> allocate_from_program_pool(CUdeviceptr* dptr, std::size_t bytes, CUmemoryPool pool) noexcept
    try {
  pool_table& t = table();
  int device = 0;
  {
    std::lock_guard lock(t.mutex);
    const auto it = t.pools.find(pool);
    if (it == t.pools.end() || it->second.destroyed) return std::nullopt;
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (bytes == 0) {  // as the driver's stream-ordered allocator: NULL, not an error
      *dptr = 0;
      return CUDA_SUCCESS;
    }
    if (it->second.max_size != 0 && bytes > it->second.max_size - std::min(it->second.max_size, it->second.used))
      return CUDA_ERROR_OUT_OF_MEMORY;
    device = it->second.device;
  }
  // Memory from the shim's pool is valid at once, which satisfies stream order too.
  CUdeviceptr got = 0;
  if (const status allocated = allocate_in_pool(device, bytes, alloc_api::cu_mem_alloc_from_pool_async, got);
      !allocated.ok())
    return allocated.code();
  try {
    std::lock_guard lock(t.mutex);
    served_pool& p = t.pools.at(pool);  // a destroy meanwhile leaves the record while this is live
    t.taken[got] = {pool, bytes};
    p.used += bytes;
    p.used_high = std::max(p.used_high, p.used);
    any_taken_from_program_pools.store(true, std::memory_order_relaxed);
  } catch (...) {
    free_in_pool(got);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = got;
  return CUDA_SUCCESS;
} catch (...) {
  return CUDA_ERROR_OUT_OF_MEMORY;
}

void program_pool_freed(std::uint64_t addr) noexcept {
  pool_table& t = table();  // made by the allocation that set any_taken_from_program_pools
  std::lock_guard lock(t.mutex);
  const auto it = t.taken.find(addr);
  if (it == t.taken.end()) return;
  const auto [pool, bytes] = it->second;
  t.taken.erase(it);
  const auto p = t.pools.find(pool);
  if (p == t.pools.end()) return;
  p->second.used -= std::min(bytes, p->second.used);
  if (p->second.destroyed && p->second.used == 0) t.pools.erase(p);
}

std::optional<CUresult> program_pool_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) noexcept
    try {
  const bool about_bytes =
      attribute == CU_MEMPOOL_ATTR_USED_MEM_CURRENT || attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH ||
      attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH;
  if (!about_bytes) return std::nullopt;
  pool_table& t = table();
  std::lock_guard lock(t.mutex);
  const auto it = t.pools.find(pool);
  if (it == t.pools.end()) return std::nullopt;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The shim's pool reserves what is taken, no more: used and reserved are one figure.
  const bool high = attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH || attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH;
  *static_cast<cuuint64_t*>(value) = high ? it->second.used_high : it->second.used;
  return CUDA_SUCCESS;
} catch (...) {
  return std::nullopt;  // no memory for the table: no pool is served
}

std::uint64_t nccl_pool_bytes() noexcept {
  if (!any_taken_from_program_pools.load(std::memory_order_relaxed)) return 0;
  pool_table& t = table();
  std::lock_guard lock(t.mutex);
  std::uint64_t bytes = 0;
  for (const auto& [pool, p] : t.pools)
    if (p.by_nccl) bytes += p.used;
  return bytes;
}

void program_pool_access(CUmemoryPool pool, const CUmemAccessDesc* desc, std::size_t count) noexcept try {
  int owner = -1;
  {
    pool_table& t = table();
    std::lock_guard lock(t.mutex);
    if (const auto it = t.pools.find(pool); it != t.pools.end()) owner = it->second.device;
  }
  if (owner < 0 || desc == nullptr) return;
  for (std::size_t i = 0; i < count; ++i)
    if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && desc[i].location.id != owner &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
      (void)grant_pool_access(owner, desc[i].location.id);  // a failure is logged
} catch (...) {
  // No memory for the table: no pool is served.
}

}  // namespace vmmckpt::detail
