// The emulator's own allocations: cuMemAlloc and friends (anonymous mmaps placed by the kernel,
// charged to the device), pinned and registered host memory, and pointer queries.
#include "config.hpp"
#include "emu_api.hpp"
#include "memory_map.hpp"
#include "native_memory.hpp"
#include "state.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <mutex>

using namespace vmmckpt::emu;

namespace {

const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
// Pitch alignment of cuMemAllocPitch on current GPUs.
constexpr std::size_t pitch_alignment = 512;

CUresult map_region(std::size_t bytes, region_kind kind, int device, unsigned host_flags, std::uintptr_t& out) {
  const std::size_t mapped = round_up(bytes, page);
  const bool on_device = kind == region_kind::native_device;
  if (on_device && !charge_device_memory(device, mapped)) return CUDA_ERROR_OUT_OF_MEMORY;
  // No hint: the kernel places it wherever it likes, which keeps it out of the shim's fixed pool.
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    if (on_device) refund_device_memory(device, mapped);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  region r;
  r.base = reinterpret_cast<std::uintptr_t>(p);
  r.size = bytes;
  r.mapped = mapped;
  r.kind = kind;
  r.device = device;
  r.host_flags = host_flags;
  auto& t = memory();
  std::unique_lock lock(t.mutex);
  r.buffer_id = t.next_buffer_id++;
  t.regions.emplace(r.base, r);
  out = r.base;
  return CUDA_SUCCESS;
}

// Frees a region of the given kind that starts exactly at `p`, without waiting for streams.
CUresult unmap_region_now(std::uintptr_t p, region_kind kind, CUresult not_found) {
  auto& t = memory();
  std::unique_lock lock(t.mutex);
  auto it = t.regions.find(p);
  if (it == t.regions.end() || it->second.kind != kind) return not_found;
  const region r = it->second;
  t.regions.erase(it);
  if (kind == region_kind::host_registered) return CUDA_SUCCESS;  // the memory belongs to the caller
  munmap(reinterpret_cast<void*>(r.base), r.mapped);
  if (kind == region_kind::native_device) refund_device_memory(r.device, r.mapped);
  return CUDA_SUCCESS;
}

CUresult unmap_region(std::uintptr_t p, region_kind kind, CUresult not_found) {
  // Queued work may still use the memory: freeing waits for it, like cudaFree/cuMemFree.
  synchronize_all_contexts();
  return unmap_region_now(p, kind, not_found);
}

}  // namespace

namespace vmmckpt::emu {

CUresult allocate_native(int device, std::size_t bytes, std::uintptr_t& out) {
  return map_region(bytes, region_kind::native_device, device, 0, out);
}

CUresult release_native(std::uintptr_t p) {
  return unmap_region_now(p, region_kind::native_device, CUDA_ERROR_INVALID_VALUE);
}

}  // namespace vmmckpt::emu

namespace {

// The range the driver names for a pointer: the reservation around a VMM mapping, else the allocation.
reservation range_of(memory_table& t, const region& r) {
  if (r.kind == region_kind::vmm_mapping)
    if (const reservation* res = t.find_reservation(r.base)) return *res;
  return reservation{r.base, r.size};
}

template <typename T>
CUresult put(void* data, T value) {
  *static_cast<T*>(data) = value;
  return CUDA_SUCCESS;
}

// How the emulator answers a pointer attribute: of memory it does not know, an error (known_only) or
// unknown host memory's answer, as the real driver does; `answer` is given the pointer's region (null:
// unknown memory).
struct pointer_answer {
  CUpointer_attribute attribute;
  bool known_only;
  CUresult (*answer)(void* data, memory_table& t, const region* r, CUdeviceptr ptr);
};

using table_ref = memory_table&;
const pointer_answer pointer_answers[] = {
    {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, true,
     [](void* data, table_ref, const region* r, CUdeviceptr) {
       return put<unsigned>(data, r->is_device() && !r->host_located ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST);
     }},
    {CU_POINTER_ATTRIBUTE_DEVICE_POINTER, true,
     [](void* data, table_ref, const region*, CUdeviceptr ptr) { return put<CUdeviceptr>(data, ptr); }},
    {CU_POINTER_ATTRIBUTE_HOST_POINTER, true,
     [](void* data, table_ref, const region* r, CUdeviceptr ptr) {
       return r->is_device() ? CUDA_ERROR_INVALID_VALUE : put<void*>(data, reinterpret_cast<void*>(ptr));
     }},
    {CU_POINTER_ATTRIBUTE_CONTEXT, true,
     [](void* data, table_ref, const region* r, CUdeviceptr) {
       return put<CUcontext>(data,
                             r->kind == region_kind::vmm_mapping ? nullptr : to_handle(primary_context(r->device)));
     }},
    {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, true,
     [](void* data, table_ref, const region* r, CUdeviceptr) { return put<int>(data, r->device); }},
    // VMM memory answers with its whole reservation, not the mapping (measured on an H200, driver 580:
    // a mapping inside a 2 TiB reservation gave the 2 TiB); cuMemGetAddressRange gives the mapping.
    {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, true,
     [](void* data, table_ref t, const region* r, CUdeviceptr) {
       return put<CUdeviceptr>(data, range_of(t, *r).base);
     }},
    {CU_POINTER_ATTRIBUTE_RANGE_SIZE, true,
     [](void* data, table_ref t, const region* r, CUdeviceptr) {
       return put<std::size_t>(data, range_of(t, *r).size);
     }},
    {CU_POINTER_ATTRIBUTE_BUFFER_ID, true,
     [](void* data, table_ref, const region* r, CUdeviceptr) { return put<unsigned long long>(data, r->buffer_id); }},
    {CU_POINTER_ATTRIBUTE_MAPPED, false,
     [](void* data, table_ref, const region* r, CUdeviceptr) { return put<int>(data, r != nullptr ? 1 : 0); }},
    {CU_POINTER_ATTRIBUTE_IS_MANAGED, false,
     [](void* data, table_ref, const region*, CUdeviceptr) { return put<int>(data, 0); }},
    {CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, false,
     [](void* data, table_ref, const region*, CUdeviceptr) { return put<int>(data, 0); }},
    {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, false,
     [](void* data, table_ref, const region*, CUdeviceptr) { return put<int>(data, 0); }},
    {CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, false,
     [](void* data, table_ref, const region*, CUdeviceptr) { return put<int>(data, 0); }},
    {CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, false,
     [](void* data, table_ref, const region* r, CUdeviceptr) {
       return put<unsigned long long>(
           data, r != nullptr && r->kind == region_kind::vmm_mapping ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0);
     }},
    {CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, false,
     [](void* data, table_ref, const region*, CUdeviceptr) {
       return put<unsigned>(data, CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
     }},
    {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, false,
     [](void* data, table_ref, const region*, CUdeviceptr) { return put<CUmemoryPool>(data, nullptr); }},
};

// Answers one pointer attribute.
CUresult pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  const region* r = t.find(ptr);
  for (const auto& a : pointer_answers)
    if (a.attribute == attribute)
      return a.known_only && r == nullptr ? CUDA_ERROR_INVALID_VALUE : a.answer(data, t, r, ptr);
  trace("cuPointerGetAttribute: attribute %d is not emulated", static_cast<int>(attribute));
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

extern "C" {

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t all = settings().device_memory;
  const std::uint64_t used = device_memory_used(ctx->device);
  *total = all;
  *free = used >= all ? 0 : all - used;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    std::uintptr_t p = 0;
    if (CUresult rc = map_region(bytesize, region_kind::native_device, ctx->device, 0, p); rc != CUDA_SUCCESS) {
      return rc;
    }
    *dptr = p;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t pitch = round_up(WidthInBytes, pitch_alignment);
    if (Height > ~std::size_t{0} / pitch) return CUDA_ERROR_INVALID_VALUE;
    std::uintptr_t p = 0;
    if (CUresult rc = map_region(pitch * Height, region_kind::native_device, ctx->device, 0, p); rc != CUDA_SUCCESS) {
      return rc;
    }
    *dptr = p;
    *pPitch = pitch;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    return unmap_region(dptr, region_kind::native_device, CUDA_ERROR_INVALID_VALUE);
  });
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    auto& t = memory();
    std::shared_lock lock(t.mutex);
    region* r = t.find(dptr);
    if (r == nullptr || !r->is_device()) return CUDA_ERROR_NOT_FOUND;
    if (pbase != nullptr) *pbase = r->base;
    if (psize != nullptr) *psize = r->size;
    return CUDA_SUCCESS;
  });
}

// Managed memory as plain device memory: the host can touch it anyway (one address space), and
// cuMemFree releases it like any native allocation.
CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
      return CUDA_ERROR_INVALID_VALUE;
    std::uintptr_t p = 0;
    if (CUresult rc = map_region(bytesize, region_kind::native_device, ctx->device, 0, p); rc != CUDA_SUCCESS)
      return rc;
    *dptr = p;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    constexpr unsigned valid = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (pp == nullptr || bytesize == 0 || (Flags & ~valid) != 0) return CUDA_ERROR_INVALID_VALUE;
    std::uintptr_t p = 0;
    if (CUresult rc = map_region(bytesize, region_kind::host_pinned, ctx->device, Flags, p); rc != CUDA_SUCCESS) {
      return rc;
    }
    *pp = reinterpret_cast<void*>(p);
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

CUresult cuMemFreeHost(void* p) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    return unmap_region(reinterpret_cast<std::uintptr_t>(p), region_kind::host_pinned, CUDA_ERROR_INVALID_VALUE);
  });
}

CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (p == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    if (t.overlaps(base, bytesize)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    region r;
    r.base = base;
    r.size = bytesize;
    r.mapped = bytesize;
    r.kind = region_kind::host_registered;
    r.device = ctx->device;
    r.host_flags = Flags;
    r.buffer_id = t.next_buffer_id++;
    t.regions.emplace(base, r);
    return CUDA_SUCCESS;
  });
}

CUresult cuMemHostUnregister(void* p) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    return unmap_region(reinterpret_cast<std::uintptr_t>(p), region_kind::host_registered,
                        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  });
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!is_page_locked(reinterpret_cast<std::uintptr_t>(p), 1)) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing: the same address
    return CUDA_SUCCESS;
  });
}

CUresult cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (pFlags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& t = memory();
    std::shared_lock lock(t.mutex);
    region* r = t.find(reinterpret_cast<std::uintptr_t>(p));
    if (r == nullptr || r->kind != region_kind::host_pinned) return CUDA_ERROR_INVALID_VALUE;
    *pFlags = r->host_flags;
    return CUDA_SUCCESS;
  });
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, attribute, ptr);
  });
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                CUdeviceptr ptr) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Unlike cuPointerGetAttribute, unknown memory is not an error here: each answer gets a neutral value.
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (data[i] == nullptr) continue;
      if (pointer_attribute(data[i], attributes[i], ptr) != CUDA_SUCCESS) {
        switch (attributes[i]) {
          case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data[i]) = 0; break;
          case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = -2; break;
          case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data[i]) = nullptr; break;
          case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
          case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data[i]) = 0; break;
          case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data[i]) = nullptr; break;
          case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<std::size_t*>(data[i]) = 0; break;
          case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data[i]) = 0; break;
          default: break;
        }
      }
    }
    return CUDA_SUCCESS;
  });
}

}  // extern "C"

// The v1 name has the same ABI (the flags argument was always there).
VMMCKPT_EMU_ALIAS(cuMemHostRegister, cuMemHostRegister_v2)

// CUDA arrays: no textures or surfaces, only the device memory they take (width x height x depth x
// channels x element size, levels summed for mipmaps), so that a program using them runs and is
// charged for them. The handle is the address of that memory.
namespace {

std::size_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d) {
  std::size_t element = 4;
  switch (d.Format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: element = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: element = 2; break;
    default: break;
  }
  return d.Width * (d.Height ? d.Height : 1) * (d.Depth ? d.Depth : 1) * d.NumChannels * element;
}

CUresult create_array(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, void*& handle) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (d.Width == 0 || d.Width > (1u << 20) || d.Height > (1u << 16) || d.Depth > (1u << 16) || levels == 0 ||
      (d.NumChannels != 1 && d.NumChannels != 2 && d.NumChannels != 4))
    return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR level = d;
  std::size_t bytes = 0;
  for (unsigned i = 0; i < levels; ++i) {
    bytes += array_bytes(level);
    level.Width = level.Width > 1 ? level.Width / 2 : level.Width;
    level.Height = level.Height > 1 ? level.Height / 2 : level.Height;
    level.Depth = level.Depth > 1 ? level.Depth / 2 : level.Depth;
  }
  std::uintptr_t p = 0;
  if (CUresult rc = map_region(bytes, region_kind::native_device, ctx->device, 0, p); rc != CUDA_SUCCESS) return rc;
  handle = reinterpret_cast<void*>(p);
  return CUDA_SUCCESS;
}

CUresult destroy_array(void* handle) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  return unmap_region(reinterpret_cast<std::uintptr_t>(handle), region_kind::native_device, CUDA_ERROR_INVALID_HANDLE);
}

}  // namespace

extern "C" {

CUresult cuArrayCreate_v2(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* desc) {
  return guarded([&] {
    if (array == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d{};
    d.Width = desc->Width;
    d.Height = desc->Height;
    d.Format = desc->Format;
    d.NumChannels = desc->NumChannels;
    void* handle = nullptr;
    const CUresult rc = create_array(d, 1, handle);
    if (rc == CUDA_SUCCESS) *array = static_cast<CUarray>(handle);
    return rc;
  });
}

CUresult cuArray3DCreate_v2(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  return guarded([&] {
    if (array == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    void* handle = nullptr;
    const CUresult rc = create_array(*desc, 1, handle);
    if (rc == CUDA_SUCCESS) *array = static_cast<CUarray>(handle);
    return rc;
  });
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray* array, const CUDA_ARRAY3D_DESCRIPTOR* desc, unsigned int levels) {
  return guarded([&] {
    if (array == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    void* handle = nullptr;
    const CUresult rc = create_array(*desc, levels, handle);
    if (rc == CUDA_SUCCESS) *array = static_cast<CUmipmappedArray>(handle);
    return rc;
  });
}

CUresult cuArrayDestroy(CUarray array) {
  return guarded([&] { return destroy_array(array); });
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
  return guarded([&] { return destroy_array(array); });
}

}  // extern "C"

// Legacy IPC is not emulated: the emulated driver knows no IPC handle, as the real one knows none of
// garbage bytes, and has opened nothing to close. (Under the shim, pool memory never reaches these.)
extern "C" {

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& t = memory();
    std::shared_lock lock(t.mutex);
    const region* r = t.find(ptr);
    // The real driver refuses host and VMM memory as invalid values; its own allocations it would share.
    if (r == nullptr || !r->is_device() || r->kind == region_kind::vmm_mapping) return CUDA_ERROR_INVALID_VALUE;
    trace("cuIpcGetMemHandle: legacy IPC is not emulated");
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr*, CUipcMemHandle, unsigned int) {
  return guarded([&] { return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuIpcCloseMemHandle(CUdeviceptr) {
  return guarded([&] { return initialized() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED; });
}

}  // extern "C"
