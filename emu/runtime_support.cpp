// What the real CUDA runtime (libcudart, shared or static) needs from a driver beyond the memory and
// stream API: stream-ordered allocation with default memory pools, module loading mode, and the
// private export tables (which the emulator does not have).
#include "config.hpp"
#include "emu_api.hpp"
#include "native_memory.hpp"
#include "state.hpp"

#include <array>
#include <cstdio>
#include <list>
#include <mutex>

using namespace vmmckpt::emu;

namespace {

// One default pool per device. Stream-ordered allocation is served by native allocations: memory
// is available at once (allocation is "ordered" trivially) and freed when the stream reaches the free.
struct mem_pool {
  int device = 0;
  std::mutex mutex;
  std::uint64_t release_threshold = 0;
  int reuse_follow_event = 1;
  int reuse_opportunistic = 1;
  int reuse_internal = 1;
};

std::array<mem_pool, max_devices>& pools() {
  static auto* p = [] {
    auto* a = new std::array<mem_pool, max_devices>;
    for (int i = 0; i < max_devices; ++i) (*a)[static_cast<std::size_t>(i)].device = i;
    return a;
  }();
  return *p;
}

// Pools the program created (cuMemPoolCreate), until cuMemPoolDestroy. Their allocations are native
// ones like the default pool's, and outlive the pool as the driver's do.
std::mutex created_mutex;
std::list<mem_pool>& created_pools() {
  static auto* p = new std::list<mem_pool>;
  return *p;
}

mem_pool* pool_of(CUmemoryPool handle) {
  for (auto& p : pools()) {
    if (reinterpret_cast<CUmemoryPool>(&p) == handle && p.device < device_count()) return &p;
  }
  std::lock_guard lock(created_mutex);
  for (auto& p : created_pools())
    if (reinterpret_cast<CUmemoryPool>(&p) == handle) return &p;
  return nullptr;
}

}  // namespace

extern "C" {

CUresult cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The driver's private interfaces are undocumented; the emulator has none.
  char id[48];
  const auto* b = reinterpret_cast<const unsigned char*>(pExportTableId->bytes);
  std::snprintf(id, sizeof id, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  trace("cuGetExportTable(%s): not emulated", id);
  *ppExportTable = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_LAZY_LOADING;  // the real default since CUDA 12.2
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pool_out = reinterpret_cast<CUmemoryPool>(&pools()[static_cast<std::size_t>(dev)]);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) { return cuDeviceGetDefaultMemPool(pool, dev); }

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
  mem_pool* p = pool_of(pool);
  if (p == nullptr || p->device != dev) {
    trace("cuDeviceSetMemPool: only the default pool is emulated");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  mem_pool* p = pool_of(pool);
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(p->mutex);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *static_cast<int*>(value) = p->reuse_follow_event; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *static_cast<int*>(value) = p->reuse_opportunistic; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *static_cast<int*>(value) = p->reuse_internal; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *static_cast<cuuint64_t*>(value) = p->release_threshold; break;
    // Nothing is kept in reserve: freed memory goes straight back.
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *static_cast<cuuint64_t*>(value) = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  mem_pool* p = pool_of(pool);
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(p->mutex);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p->reuse_follow_event = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p->reuse_opportunistic = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p->reuse_internal = *static_cast<int*>(value); break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->release_threshold = *static_cast<cuuint64_t*>(value); break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: break;  // resetting the (always zero) watermarks
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return pool_of(pool) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (pool == nullptr || props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = check_device(props->location.id); rc != CUDA_SUCCESS) return rc;
    std::lock_guard lock(created_mutex);
    mem_pool& p = created_pools().emplace_back();
    p.device = props->location.id;
    *pool = reinterpret_cast<CUmemoryPool>(&p);
    return CUDA_SUCCESS;
  });
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    std::lock_guard lock(created_mutex);
    auto& created = created_pools();
    for (auto it = created.begin(); it != created.end(); ++it)
      if (reinterpret_cast<CUmemoryPool>(&*it) == pool) {
        created.erase(it);
        return CUDA_SUCCESS;
      }
    return CUDA_ERROR_INVALID_VALUE;  // a default pool, or no pool
  });
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    mem_pool* p = pool_of(pool);
    if (dptr == nullptr || bytesize == 0 || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uintptr_t addr = 0;
    if (CUresult rc = allocate_native(p->device, bytesize, addr); rc != CUDA_SUCCESS) return rc;
    *dptr = addr;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    std::uintptr_t p = 0;
    if (CUresult rc = allocate_native(s->owner()->device, bytesize, p); rc != CUDA_SUCCESS) return rc;
    *dptr = p;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return guarded([&] {
    std::shared_ptr<stream_engine> s;
    if (CUresult rc = resolve_stream(hStream, s); rc != CUDA_SUCCESS) return rc;
    if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    // Freed in stream order: work queued before the free may still use the memory.
    submit(s, [dptr] { release_native(dptr); });
    return CUDA_SUCCESS;
  });
}

}  // extern "C"

VMMCKPT_EMU_ALIAS(cuMemAllocAsync_ptsz, cuMemAllocAsync)
VMMCKPT_EMU_ALIAS(cuMemFreeAsync_ptsz, cuMemFreeAsync)
VMMCKPT_EMU_ALIAS(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync)
