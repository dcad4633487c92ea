// Creates each device's pool at its fixed address, finds pools by address, and keeps them safe across fork().
#include "memory/pools.hpp"

#include <pthread.h>

#include <array>
#include <map>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "core/first_use.hpp"
#include "core/gate.hpp"
#include "vmmckpt/pool/alloc_api.hpp"
#include "memory/cuda_backend.hpp"
#include "memory/memory_tags.hpp"
#include "vmmckpt/support/address_ranges.hpp"
#include "vmmckpt/pool/exact_reservation.hpp"
#include "vmmckpt/support/log.hpp"
#include "core/real_symbols.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::detail {
namespace {

struct device_slot {
  std::atomic<device_pool*> pool{nullptr};
  std::unique_ptr<cuda_backend> backend;
  std::unique_ptr<device_pool> owner;
  CUresult failure = CUDA_SUCCESS;  // remembered so the reason is logged once
  // Devices besides this one that the pool's memory is accessible from (bit d: device d). `mapped_for`
  // is what each new segment is mapped for; `granted` is set once the existing segments have it too,
  // and is what callers test. Never cleared: access outlives disabling peer access (docs/pool.md).
  std::atomic<std::uint32_t> mapped_for{0};
  std::atomic<std::uint32_t> granted{0};
};

struct registry {
  std::mutex mutex;        // creation only; lookups read the atomics
  std::mutex grant_mutex;  // one grant at a time; taken before any pool's lock, never under one
  std::array<device_slot, max_devices> slots;
  pool_config config;
  std::string config_error;
  bool config_read = false;
  std::atomic<bool> config_valid{false};  // lets lookups skip the mutex
  std::atomic<bool> forked_child{false};
};

registry& the_registry() {
  static registry r;
  return r;
}

void before_fork() {
  registry& r = the_registry();
  r.mutex.lock();
  for (auto& slot : r.slots)
    if (device_pool* p = slot.pool.load()) p->hold_for_fork();
  log::hold_for_fork();
}

void after_fork_in_parent() {
  registry& r = the_registry();
  log::release_after_fork();
  for (auto& slot : r.slots)
    if (device_pool* p = slot.pool.load()) p->release_after_fork();
  r.mutex.unlock();
}

void after_fork_in_child() {
  after_fork_in_parent();
  // The parent's GPU mappings are not the child's: step aside entirely.
  registry& r = the_registry();
  for (auto& slot : r.slots)
    if (slot.pool.load() != nullptr) r.forked_child.store(true);
}

// `lasting`: the failure will not go away by trying again (the range is taken, the device unsuitable).
// The driver not ready (no cuInit, no device) is no news: the caller sees that error, and it is not logged.
status create_pool(registry& r, int ordinal, device_slot& slot, bool& lasting) {
  const driver_api* d = driver();
  if (d == nullptr) return status(CUDA_ERROR_NOT_INITIALIZED, "no CUDA driver");
  const pool_config& cfg = r.config;
  CUresult e = d->cuInit(0);
  if (e != CUDA_SUCCESS) return status(e, "cuInit failed");
  CUdevice device;
  if ((e = d->cuDeviceGet(&device, ordinal)) != CUDA_SUCCESS) return status(e, "no such device");
  CUcontext primary;
  if ((e = d->cuDevicePrimaryCtxRetain(&primary, device)) != CUDA_SUCCESS) return status(e, "no primary context");

  const CUmemAllocationProp prop = cuda_backend::allocation_properties(device);
  size_t granularity = 0;
  e = d->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (e != CUDA_SUCCESS)
    return failure(e, "device {}: cannot read the VMM granularity (error {}); no pool", ordinal, static_cast<int>(e));
  if (granularity == 0 || large_alignment % granularity != 0 || cfg.size % granularity != 0)
    return failure(CUDA_ERROR_NOT_SUPPORTED, "device {}: VMM granularity {} does not divide 2 MiB; no pool", ordinal,
                   granularity);

  const std::uint64_t base = cfg.device_base(ordinal);
  std::uint64_t moved_to = 0;
  e = reserve_exactly(*d, base, cfg.size, granularity, moved_to);
  if (moved_to != 0)
    return failure(CUDA_ERROR_OUT_OF_MEMORY,
                   "device {}: the pool range [{:#x}, {:#x}) is taken in this process (the driver offered {:#x}); "
                   "set VMMCKPT_POOL_BASE to a free range. Allocations on this device will fail.",
                   ordinal, base, base + cfg.size, moved_to);
  if (e != CUDA_SUCCESS)
    return failure(CUDA_ERROR_OUT_OF_MEMORY,
                   "device {}: reserving the pool [{:#x}, {:#x}) failed (error {}); allocations will fail", ordinal,
                   base, base + cfg.size, static_cast<int>(e));

  pool_policy policy;
  policy.granularity = granularity;
  policy.growth_step = align_up(cfg.growth_step, granularity);
  policy.retain_bytes = cfg.retain_bytes;
  policy.cache_bytes = cfg.thread_cache_bytes;
  try {
    slot.backend = std::make_unique<cuda_backend>(device, primary, slot.mapped_for);
    slot.owner = std::make_unique<device_pool>(base, cfg.size, policy, *slot.backend);
  } catch (...) {
    // No memory for the pool's own structures: the range goes back, so a later call can try again.
    slot.owner.reset();
    slot.backend.reset();
    d->cuMemAddressFree(base, cfg.size);
    lasting = false;
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "device {}: no memory for the pool's bookkeeping; the allocation fails",
                   ordinal);
  }
  slot.pool.store(slot.owner.get(), std::memory_order_release);
  log::info("device {}: pool of {} GiB reserved at {:#x}", ordinal, cfg.size >> 30, base);
  return {};
}

}  // namespace

bool shim_active() { return !the_registry().forked_child.load(std::memory_order_relaxed); }

void step_aside_in_child() { the_registry().forked_child.store(true); }

status acquire_pool(int ordinal, device_pool*& pool) {
  registry& r = the_registry();
  if (ordinal < 0 || ordinal >= max_devices)
    return failure(CUDA_ERROR_INVALID_DEVICE, "device {}: vmmckpt serves devices 0 to {}", ordinal, max_devices - 1);
  device_slot& slot = r.slots[ordinal];
  if ((pool = slot.pool.load(std::memory_order_acquire)) != nullptr) return {};

  std::lock_guard lock(r.mutex);
  if ((pool = slot.pool.load(std::memory_order_acquire)) != nullptr) return {};
  if (slot.failure != CUDA_SUCCESS)
    return status(slot.failure, "device " + std::to_string(ordinal) + ": no pool (said before)");
  if (!r.config_read) {
    r.config = pool_config_from_env(r.config_error);
    r.config_read = true;
    r.config_valid.store(r.config_error.empty(), std::memory_order_release);
    static std::once_flag fork_handlers;
    std::call_once(fork_handlers, [] { pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
  }
  if (!r.config_error.empty()) {
    slot.failure = CUDA_ERROR_OUT_OF_MEMORY;
    return failure(slot.failure, "{}; no pool, allocations will fail", r.config_error);
  }
  bool lasting = true;
  status made = create_pool(r, ordinal, slot, lasting);
  if (!made.ok()) {
    // Driver not ready yet (no cuInit, no device) is the caller's error to see
    // again next time; a pool that cannot be placed stays refused.
    if (lasting && (made.code() == CUDA_ERROR_OUT_OF_MEMORY || made.code() == CUDA_ERROR_NOT_SUPPORTED))
      slot.failure = made.code();
    return made;
  }
  pool = slot.pool.load();
  if (active_pools().size() > 1) several_pools_exist.store(true, std::memory_order_relaxed);
  note_served_memory();  // first CUDA use: from now on cuda-ckpt can reach this process
  return {};
}

int pool_device_containing(std::uint64_t addr) {
  registry& r = the_registry();
  if (!r.config_valid.load(std::memory_order_acquire)) return -1;
  const pool_config& cfg = r.config;
  if (addr < cfg.base) return -1;
  const std::uint64_t index = (addr - cfg.base) / cfg.size;
  if (index >= static_cast<std::uint64_t>(max_devices)) return -1;
  return r.slots[index].pool.load(std::memory_order_acquire) != nullptr ? static_cast<int>(index) : -1;
}

device_pool* pool_containing(std::uint64_t addr) {
  const int ordinal = pool_device_containing(addr);
  return ordinal < 0 ? nullptr : the_registry().slots[ordinal].pool.load(std::memory_order_acquire);
}

std::uint32_t pool_peers(int ordinal) {
  if (ordinal < 0 || ordinal >= max_devices) return 0;
  return the_registry().slots[ordinal].granted.load(std::memory_order_acquire);
}

status grant_pool_access(int owner, int device) {
  if (owner < 0 || owner >= max_devices || device < 0 || device >= max_devices || owner == device)
    return status(CUDA_ERROR_INVALID_DEVICE, "no such pair of devices");
  registry& r = the_registry();
  device_slot& slot = r.slots[owner];
  const std::uint32_t bit = 1U << device;
  if ((slot.granted.load(std::memory_order_acquire) & bit) != 0) return {};
  std::lock_guard lock(r.grant_mutex);
  if ((slot.granted.load(std::memory_order_acquire) & bit) != 0) return {};
  // Segments mapped from now on get the access; then those mapped before. A mapping runs under the
  // pool's lock, which the walk takes after the store: each segment is either in the walk or mapped
  // after the store, seeing it.
  slot.mapped_for.fetch_or(bit, std::memory_order_acq_rel);
  if (device_pool* pool = slot.pool.load(std::memory_order_acquire))
    if (const CUresult e = slot.backend->grant_existing(*pool, static_cast<CUdevice>(device)); e != CUDA_SUCCESS)
      return failure(e, "device {}: giving device {} access to the pool failed (error {})", owner, device,
                     static_cast<int>(e));
  slot.granted.fetch_or(bit, std::memory_order_release);
  log::info("device {}: pool memory accessible from device {} too", owner, device);
  return {};
}

std::vector<active_pool> active_pools() {
  std::vector<active_pool> out;
  auto& slots = the_registry().slots;
  for (int i = 0; i < max_devices; ++i)
    if (device_pool* p = slots[i].pool.load(std::memory_order_acquire)) out.push_back({i, p});
  return out;
}

restore::backed_memory pool_memory_backed() {
  auto by_device = std::make_shared<std::map<int, address_ranges>>();
  for (const auto& p : active_pools()) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const auto& s : p.pool->segments()) ranges.emplace_back(s.addr, s.size);
    by_device->emplace(p.ordinal, address_ranges(std::move(ranges)));
  }
  return [by_device](int device, std::uint64_t addr, std::uint64_t size) {
    const auto it = by_device->find(device);
    return it != by_device->end() && it->second.covers(addr, size);
  };
}

std::uint64_t reusable_pool_bytes(int ordinal) {
  if (ordinal < 0 || ordinal >= max_devices) return 0;
  device_pool* p = the_registry().slots[ordinal].pool.load(std::memory_order_acquire);
  if (p == nullptr) return 0;
  const pool_stats s = p->stats();
  return s.backed_bytes - s.live_bytes;
}

CUresult to_cuda_result(pool_status status, int backend_error) {
  switch (status) {
    case pool_status::ok: return CUDA_SUCCESS;
    case pool_status::out_of_memory: return CUDA_ERROR_OUT_OF_MEMORY;
    case pool_status::invalid_value: return CUDA_ERROR_INVALID_VALUE;
    case pool_status::backend_error: return static_cast<CUresult>(backend_error);
  }
  return CUDA_ERROR_UNKNOWN;
}

status allocate_in_pool(int ordinal, std::size_t size, alloc_api api, CUdeviceptr& out) {
  // The allocation table must not change while a dump holds the program; no GPU work is submitted.
  gate_scope scope(gate_scope::no_work);
  device_pool* pool = nullptr;
  VMMCKPT_TRY(acquire_pool(ordinal, pool));
  std::uint64_t addr = 0;
  int backend_error = 0;
  const pool_status result = pool->allocate(size, api, addr, &backend_error);
  if (result != pool_status::ok) {
    // Running out is the program's business (PyTorch frees its cache and tries again): said at info, not warn.
    const CUresult e = to_cuda_result(result, backend_error);
    log::info("{} of {} bytes on device {} failed: error {}", name_of(api), size, ordinal, static_cast<int>(e));
    return status(e, "out of pool memory");
  }
  out = addr;
  if (any_memory_tagged.load(std::memory_order_relaxed)) tag_new(tagged_kind::pool_block, addr);
  log::at(log::level::trace, "{} {} bytes -> {:#x}", name_of(api), size, addr);
  return {};
}

void free_in_pool(CUdeviceptr addr) noexcept {
  gate_scope scope(gate_scope::no_work);
  if (device_pool* pool = pool_containing(addr);
      pool != nullptr && pool->free(addr) == pool_status::ok && any_memory_tagged.load(std::memory_order_relaxed))
    untag_block(addr);
}

}  // namespace vmmckpt::detail
