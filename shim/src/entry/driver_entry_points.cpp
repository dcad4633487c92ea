// The driver API doors into the pool: cuMemAlloc_v2 and its family, plus what passes through.
#include <cuda.h>

#include <optional>

#include "entry/entry_points.hpp"
#include "core/gate.hpp"
#include "memory/ipc_exports.hpp"
#include "memory/memory_tags.hpp"
#include "core/callers.hpp"
#include "core/first_use.hpp"
#include "memory/not_owned_memory.hpp"
#include "memory/program_pools.hpp"
#include "operations/restore.hpp"
#include "memory/vmm_state.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::detail {

CUresult current_device(int& ordinal) {
  const driver_api* d = driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUdevice device;
  const CUresult e = d->cuCtxGetDevice(&device);
  if (e == CUDA_SUCCESS) ordinal = device;
  return e;
}

CUresult stream_device(CUstream stream, int& ordinal) {
  const driver_api* d = driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (stream != nullptr && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD &&
      d->cuStreamGetDevice != nullptr) {
    CUdevice device;
    const CUresult e = d->cuStreamGetDevice(stream, &device);
    if (e == CUDA_SUCCESS) ordinal = device;
    return e;
  }
  return current_device(ordinal);
}

CUresult pool_allocate(int ordinal, std::size_t size, alloc_api api, CUdeviceptr& out) {
  if (!restore_ready()) return CUDA_ERROR_OUT_OF_MEMORY;
  return allocate_in_pool(ordinal, size, api, out).code();
}

bool pool_free(CUdeviceptr addr, CUresult& result) {
  restore_ready();  // a restored pointer may be freed before any other memory call
  device_pool* pool = pool_containing(addr);
  if (pool == nullptr) return false;
  gate_scope scope(gate_scope::no_work);
  std::optional<CUresult> kept;  // other processes still map it (legacy IPC)
  if (any_pool_memory_exported.load(std::memory_order_relaxed)) kept = free_exported(addr);
  const pool_status status = kept ? pool_status::ok : pool->free(addr);
  if (kept && *kept != CUDA_SUCCESS) {
    result = *kept;
    return true;
  }
  if (status == pool_status::ok && any_taken_from_program_pools.load(std::memory_order_relaxed))
    program_pool_freed(addr);
  if (status == pool_status::ok && any_memory_tagged.load(std::memory_order_relaxed)) untag_block(addr);
  if (status != pool_status::ok)
    log::info("free of {:#x}: not a live pool allocation", static_cast<std::uint64_t>(addr));
  result = to_cuda_result(status, 0);
  return true;
}

namespace {

CUresult allocate_async(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytesize == 0) {  // the driver's stream-ordered allocator answers NULL, not an error
    *dptr = 0;
    return CUDA_SUCCESS;
  }
  int ordinal = 0;
  const CUresult e = stream_device(stream, ordinal);
  if (e != CUDA_SUCCESS) return e;
  // Memory from the pool is valid at once, which satisfies stream order too.
  return pool_allocate(ordinal, bytesize, alloc_api::cu_mem_alloc_async, *dptr);
}

using alloc_async_fn = decltype(&::cuMemAllocAsync);
using free_async_fn = decltype(&::cuMemFreeAsync);

// cuMemAllocAsync and its per-thread-stream twin; `real` names the driver's own.
CUresult alloc_async_entry(alloc_async_fn driver_api::*real, CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return with_driver(CUDA_ERROR_OUT_OF_MEMORY, [&](const driver_api& d) {
    if (!shim_active()) return d.*real != nullptr ? (d.*real)(dptr, bytesize, stream) : CUDA_ERROR_NOT_SUPPORTED;
    return allocate_async(dptr, bytesize, stream);
  });
}

// A pointer the pool does not own, freed by the driver: passthrough memory no longer live.
CUresult forgotten_if_freed(CUdeviceptr dptr, CUresult freed) {
  if (freed == CUDA_SUCCESS) forget_passthrough(dptr);
  return freed;
}

// A passthrough allocation the driver made, counted as not owned.
CUresult noted_if_made(passthrough_kind kind, std::uint64_t key, std::uint64_t bytes, CUresult made) {
  if (made == CUDA_SUCCESS) note_passthrough(kind, key, bytes);
  return made;
}

std::uint64_t key_of(const void* handle) { return reinterpret_cast<std::uintptr_t>(handle); }

// cuMemFreeAsync and its twin. Quarantine keeps the block from reuse until work before this point is done.
CUresult free_async_entry(free_async_fn driver_api::*real, CUdeviceptr dptr, CUstream stream) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    CUresult result;
    if (shim_active() && pool_free(dptr, result)) return result;
    if (d.*real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return forgotten_if_freed(dptr, (d.*real)(dptr, stream));
  });
}

}  // namespace
}  // namespace vmmckpt::detail

using namespace vmmckpt;
using namespace vmmckpt::detail;

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return with_driver(CUDA_ERROR_OUT_OF_MEMORY, [&](const driver_api& d) {
    if (!shim_active()) return d.cuMemAlloc_v2(dptr, bytesize);
    int ordinal = 0;
    const CUresult e = current_device(ordinal);
    if (e != CUDA_SUCCESS) return e;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return pool_allocate(ordinal, bytesize, alloc_api::cu_mem_alloc, *dptr);
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                                   unsigned int element_size) {
  return with_driver(CUDA_ERROR_OUT_OF_MEMORY, [&](const driver_api& d) {
    if (!shim_active()) return d.cuMemAllocPitch_v2(dptr, pitch, width, height, element_size);
    int ordinal = 0;
    const CUresult e = current_device(ordinal);
    if (e != CUDA_SUCCESS) return e;
    if (dptr == nullptr || pitch == nullptr || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (element_size != 4 && element_size != 8 && element_size != 16) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t row = align_up(width, pitch_alignment);
    if (row < width || height > SIZE_MAX / row) return CUDA_ERROR_INVALID_VALUE;
    const CUresult r = pool_allocate(ordinal, row * height, alloc_api::cu_mem_alloc_pitch, *dptr);
    if (r == CUDA_SUCCESS) *pitch = row;
    return r;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    CUresult result;
    if (shim_active() && pool_free(dptr, result)) return result;
    return forgotten_if_freed(dptr, d.cuMemFree_v2(dptr));
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return alloc_async_entry(&driver_api::cuMemAllocAsync, dptr, bytesize, stream);
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return alloc_async_entry(&driver_api::cuMemAllocAsync_ptsz, dptr, bytesize, stream);
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return free_async_entry(&driver_api::cuMemFreeAsync, dptr, stream);
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return free_async_entry(&driver_api::cuMemFreeAsync_ptsz, dptr, stream);
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    const CUresult e = d.cuMemGetInfo_v2(free_bytes, total_bytes);
    int ordinal = 0;
    if (e == CUDA_SUCCESS && shim_active() && free_bytes != nullptr && current_device(ordinal) == CUDA_SUCCESS) {
      // Pool memory that is mapped but not live is still the program's to use.
      *free_bytes += reusable_pool_bytes(ordinal);
      if (total_bytes != nullptr && *free_bytes > *total_bytes) *free_bytes = *total_bytes;
    }
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    if (shim_active()) restore_ready();
    device_pool* pool = shim_active() ? pool_containing(dptr) : nullptr;
    if (pool == nullptr) return d.cuMemGetAddressRange_v2(pbase, psize, dptr);
    std::uint64_t base = 0, size = 0;
    // The driver only knows the mapped handles; the allocation is ours to name.
    if (!pool->address_range(dptr, base, size)) return CUDA_ERROR_NOT_FOUND;
    if (pbase != nullptr) *pbase = base;
    if (psize != nullptr) *psize = size;
    return CUDA_SUCCESS;
  });
}

namespace {
// The range attributes of a pool address name its allocation (the driver would name the pool's whole
// reservation), and its memory can be shared through legacy IPC (ipc_entry_points.cpp; the driver says VMM
// memory cannot). Other attributes, and other memory, are the driver's to answer.
bool is_pool_attribute(CUpointer_attribute a) {
  return a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || a == CU_POINTER_ATTRIBUTE_RANGE_SIZE ||
         a == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
}

// The range attributes of an address in a VMM window name the program's reservation around it (the driver
// would name the whole window, reserved by the shim).
bool is_range_attribute(CUpointer_attribute a) {
  return a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || a == CU_POINTER_ATTRIBUTE_RANGE_SIZE;
}

void write_pool_attribute(CUpointer_attribute a, void* data, std::uint64_t base, std::uint64_t size) {
  if (a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
    *static_cast<CUdeviceptr*>(data) = base;
  else if (a == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
    *static_cast<std::size_t*>(data) = size;
  else
    *static_cast<int*>(data) = size != 0 ? 1 : 0;
}

// Writes a pool block's attribute; false when ptr is in no live block.
bool pool_attribute(device_pool& pool, CUpointer_attribute a, CUdeviceptr ptr, void* data) {
  std::uint64_t base = 0, size = 0;
  if (!pool.address_range(ptr, base, size)) return false;
  write_pool_attribute(a, data, base, size);
  return true;
}
}  // namespace

VMMCKPT_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuPointerGetAttribute == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (shim_active()) restore_ready();
    std::uint64_t base = 0, size = 0;
    if (shim_active() && data != nullptr && is_range_attribute(attribute) && vmm_reservation_around(ptr, base, size)) {
      if (size == 0) return CUDA_ERROR_INVALID_VALUE;  // no reservation of the program's there
      write_pool_attribute(attribute, data, base, size);
      return CUDA_SUCCESS;
    }
    device_pool* pool = shim_active() && is_pool_attribute(attribute) ? pool_containing(ptr) : nullptr;
    if (pool == nullptr || data == nullptr) return d->cuPointerGetAttribute(data, attribute, ptr);
    // Memory that is no allocation: what the driver answers for an address it does not know.
    return pool_attribute(*pool, attribute, ptr, data) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                                       CUdeviceptr ptr) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuPointerGetAttributes == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (shim_active()) restore_ready();
    const CUresult r = d->cuPointerGetAttributes(count, attributes, data, ptr);
    std::uint64_t base = 0, size = 0;
    if (r == CUDA_SUCCESS && shim_active() && vmm_reservation_around(ptr, base, size)) {
      for (unsigned i = 0; i < count; ++i)
        if (data[i] != nullptr && is_range_attribute(attributes[i]))
          write_pool_attribute(attributes[i], data[i], base, size);
      return r;
    }
    device_pool* pool = shim_active() ? pool_containing(ptr) : nullptr;
    if (r != CUDA_SUCCESS || pool == nullptr) return r;
    for (unsigned i = 0; i < count; ++i) {
      if (data[i] == nullptr || !is_pool_attribute(attributes[i])) continue;
      // No allocation there: the neutral answer the driver gives for unknown memory.
      if (!pool_attribute(*pool, attributes[i], ptr, data[i])) write_pool_attribute(attributes[i], data[i], 0, 0);
    }
    return r;
  });
}

// Memory the pool does not serve: named once in the log, passed through, and its live bytes counted
// (not_owned_memory.hpp) so that a dump can say what its image lacks.

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuMemAllocManaged == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    VMMCKPT_NOT_SERVED("managed memory (cuMemAllocManaged/cudaMallocManaged)");
    const CUresult e = d->cuMemAllocManaged(dptr, bytesize, flags);
    return noted_if_made(passthrough_kind::managed, e == CUDA_SUCCESS ? *dptr : 0, bytesize, e);
  });
}

// Pools of device memory that no other process imports are served by the shim's pool (program_pools.hpp): the
// driver's pool is made too, empty, for the calls about anything but bytes. Other pools pass through, and what
// is taken from them is counted as not owned until freed (also after cuMemPoolDestroy: the driver keeps a
// destroyed pool's allocations valid until their free).
VMMCKPT_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  const void* caller = __builtin_return_address(0);
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuMemPoolCreate == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const bool served = shim_active() && props != nullptr && pool != nullptr && servable_pool(*props);
    if (!served) VMMCKPT_NOT_SERVED("a memory pool shareable with other processes or on the host (cuMemPoolCreate)");
    const CUresult e = d->cuMemPoolCreate(pool, props);
    if (e == CUDA_SUCCESS && served) {
      note_program_pool(*pool, *props, called_from_nccl(caller));
      note_served_memory();  // a program whose first memory is a pool's is reachable from then on
    }
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuMemPoolDestroy == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuMemPoolDestroy(pool);
    if (e == CUDA_SUCCESS) forget_program_pool(pool);
    return e;
  });
}

namespace {
template <class Real>
CUresult allocate_from_pool(Real real, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (shim_active() && restore_ready())
    if (const std::optional<CUresult> served = allocate_from_program_pool(dptr, bytesize, pool)) return *served;
  VMMCKPT_NOT_SERVED("allocation from a memory pool shareable with other processes (cuMemAllocFromPoolAsync)");
  const CUresult e = real(dptr, bytesize, pool, stream);
  return noted_if_made(passthrough_kind::memory_pools, e == CUDA_SUCCESS ? *dptr : 0, bytesize, e);
}
}  // namespace

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                        CUstream stream) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    return allocate_from_pool(d.cuMemAllocFromPoolAsync, dptr, bytesize, pool, stream);
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                             CUstream stream) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    return allocate_from_pool(d.cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, stream);
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuMemPoolGetAttribute == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (const std::optional<CUresult> ours = program_pool_attribute(pool, attribute, value)) return *ours;
    return d->cuMemPoolGetAttribute(pool, attribute, value);
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuMemPoolSetAccess == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuMemPoolSetAccess(pool, map, count);
    if (e == CUDA_SUCCESS && shim_active()) program_pool_access(pool, map, count);
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* desc) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuArrayCreate_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    VMMCKPT_NOT_SERVED("CUDA arrays (cuArrayCreate/cudaMallocArray)");
    const CUresult e = d->cuArrayCreate_v2(array, desc);
    if (e != CUDA_SUCCESS) return e;
    CUDA_ARRAY3D_DESCRIPTOR as_3d{};
    as_3d.Width = desc->Width;
    as_3d.Height = desc->Height;
    as_3d.Format = desc->Format;
    as_3d.NumChannels = desc->NumChannels;
    return noted_if_made(passthrough_kind::arrays, key_of(*array), array_bytes(as_3d), e);
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuArray3DCreate_v2 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    VMMCKPT_NOT_SERVED("CUDA arrays (cuArray3DCreate/cudaMalloc3DArray)");
    const CUresult e = d->cuArray3DCreate_v2(array, desc);
    return e == CUDA_SUCCESS ? noted_if_made(passthrough_kind::arrays, key_of(*array), array_bytes(*desc), e) : e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                                       unsigned int levels) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuMipmappedArrayCreate == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    VMMCKPT_NOT_SERVED("mipmapped arrays (cuMipmappedArrayCreate)");
    const CUresult e = d->cuMipmappedArrayCreate(array, desc, levels);
    return e == CUDA_SUCCESS
               ? noted_if_made(passthrough_kind::arrays, key_of(*array), mipmapped_array_bytes(*desc, levels), e)
               : e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray array) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuArrayDestroy == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuArrayDestroy(array);
    if (e == CUDA_SUCCESS) forget_passthrough(key_of(array));
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray array) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuMipmappedArrayDestroy == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuMipmappedArrayDestroy(array);
    if (e == CUDA_SUCCESS) forget_passthrough(key_of(array));
    return e;
  });
}
