// CUDA virtual memory management on host memory: reservations are PROT_NONE mappings, physical
// handles are memfds (shareable across processes by fd), cuMemMap maps the memfd in place and
// cuMemSetAccess mprotects it, so touching memory without access faults as it would on a GPU.
#include "config.hpp"
#include "emu_api.hpp"
#include "memory_map.hpp"
#include "state.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

using namespace vmmckpt::emu;

namespace {

struct physical {
  int fd = -1;
  std::size_t size = 0;
  int device = 0;         // host-located memory: 0, and `host` set
  bool host = false;      // created on a host location (HOST, HOST_NUMA, HOST_NUMA_CURRENT)
  bool imported = false;  // imported handles were charged in the exporting process
  int refs = 1;           // create/import and each cuMemRetainAllocationHandle; cuMemRelease drops
  int mappings = 0;       // memory stays alive while mapped, even after the last release
  CUmemAllocationProp prop{};
};

// Guarded by memory().mutex, like the regions the handles are mapped into.
std::unordered_map<std::uint64_t, physical>& handles() {
  static auto* h = new std::unordered_map<std::uint64_t, physical>;
  return *h;
}
std::uint64_t g_next_handle = 1;

bool aligned(std::uint64_t v) { return v % granularity == 0; }

void drop_if_unused(std::uint64_t id) {
  auto& h = handles();
  auto it = h.find(id);
  if (it == h.end() || it->second.refs > 0 || it->second.mappings > 0) return;
  close(it->second.fd);
  if (!it->second.imported && !it->second.host) refund_device_memory(it->second.device, it->second.size);
  h.erase(it);
}

bool host_location(CUmemLocationType t) {
  return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
         t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

// A device, or the host's one NUMA node (id 0): the emulated machine has no other.
CUresult check_location(const CUmemLocation& loc) {
  if (loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) return loc.id == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (loc.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (loc.id < 0 || loc.id >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

CUresult check_prop(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  // Memory may live on the host (NCCL's host buffers); only a device or the host's NUMA node 0 is known.
  const bool on_host = host_location(prop->location.type);
  if (on_host && prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA && prop->location.id != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!on_host)
    if (CUresult rc = check_location(prop->location); rc != CUDA_SUCCESS) return rc;
  const unsigned types = prop->requestedHandleTypes;
  if ((types & ~static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) != 0) {
    trace("cuMemCreate: handle types 0x%x other than POSIX_FILE_DESCRIPTOR are not emulated", types);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

void* anonymous_reserve(void* at, std::size_t size, int extra_flags) {
  return mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
}

// Collects the mappings that exactly tile [p, p+n): unmap and access changes work on whole mappings.
bool whole_mappings(memory_table& t, std::uintptr_t p, std::size_t n, std::vector<region*>& out) {
  std::uintptr_t at = p;
  const std::uintptr_t end = p + n;
  while (at < end) {
    auto it = t.regions.find(at);
    if (it == t.regions.end() || it->second.kind != region_kind::vmm_mapping) return false;
    out.push_back(&it->second);
    at = it->second.end();
  }
  return at == end;
}

// Puts a PROT_NONE reservation back over an unmapped range: the VA stays reserved, access faults.
void restore_reservation(region& r) {
  anonymous_reserve(reinterpret_cast<void*>(r.base), r.size, MAP_FIXED);
  auto& h = handles();
  if (auto it = h.find(r.handle); it != h.end()) --it->second.mappings;
}

constexpr int host_memfd = -2;  // device_of_memfd's answer for host-located memory

int device_of_memfd(int fd) {
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char target[256] = {};
  ssize_t len = readlink(link, target, sizeof target - 1);
  if (len <= 0) return -1;
  if (std::strncmp(target, "/memfd:vmmckpt-emu-host", 23) == 0) return host_memfd;
  int dev = -1;
  if (std::sscanf(target, "/memfd:vmmckpt-emu-dev%d", &dev) != 1) return -1;
  return dev;
}

// The real driver places a small reservation in its own ranges and ignores its hint (measured on an
// H200, driver 580: 2, 4 and 8 MiB, and 16 MiB unless aligned to its size, came back elsewhere; 32 MiB
// and more, and 8 MiB aligned to 8 MiB, at the hint). The emulator does the same, so that code which
// relies on hints is tested against the driver's answer.
bool hint_honoured(std::size_t size, std::size_t alignment) {
  constexpr std::size_t mib = std::size_t{1} << 20;
  return size >= 32 * mib || (size >= 8 * mib && alignment >= size);
}

// cuMemSetAccess's descriptors: each a valid location and one of the three protections.
CUresult check_access(const CUmemAccessDesc* desc, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    if (CUresult rc = check_location(desc[i].location); rc != CUDA_SUCCESS) return rc;
    const auto f = desc[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

// Gives a mapping the access the descriptors name.
CUresult set_access(region& r, const CUmemAccessDesc* desc, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const auto flags = static_cast<unsigned char>(desc[i].flags);
    if (desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
      if (!r.host_located) return CUDA_ERROR_INVALID_VALUE;  // the host reaches device memory only by copies
      r.host_access = flags;
    } else {
      r.access[static_cast<std::size_t>(desc[i].location.id)] = flags;
    }
  }
  // All emulated devices share one address space: the host protection is the union of them.
  unsigned best = r.host_access;
  for (unsigned char a : r.access) best |= a;
  const int prot = best == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : best != 0                                ? PROT_READ
                                                              : PROT_NONE;
  if (mprotect(reinterpret_cast<void*>(r.base), r.size, prot) != 0) return CUDA_ERROR_UNKNOWN;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuMemGetAllocationGranularity(size_t* gran, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (gran == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return rc;
  *gran = granularity;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ptr == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (alignment < granularity) alignment = granularity;
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    void* got = MAP_FAILED;
    if (addr != 0 && addr % alignment == 0 && hint_honoured(size, alignment)) {
      // Honoured exactly when the range is free; otherwise the real driver silently picks another
      // address and still succeeds, so we do the same.
      void* want = reinterpret_cast<void*>(addr);
      got = anonymous_reserve(want, size, MAP_FIXED_NOREPLACE);
      if (got != MAP_FAILED && got != want) {  // kernels before 4.17 treat the flag as a hint
        munmap(got, size);
        got = MAP_FAILED;
      }
    }
    if (got == MAP_FAILED) {
      if (size + alignment < size) return CUDA_ERROR_OUT_OF_MEMORY;
      void* wide = anonymous_reserve(nullptr, size + alignment, 0);
      if (wide == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
      const auto lo = reinterpret_cast<std::uintptr_t>(wide);
      const auto start = round_up(lo, alignment);
      if (start > lo) munmap(wide, start - lo);
      if (const auto tail = lo + size + alignment - (start + size); tail > 0) {
        munmap(reinterpret_cast<void*>(start + size), tail);
      }
      got = reinterpret_cast<void*>(start);
    }
    const auto base = reinterpret_cast<std::uintptr_t>(got);
    t.reservations[base] = reservation{base, size};
    *ptr = base;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    auto it = t.reservations.find(ptr);
    if (it == t.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    // Mappings left inside are dropped with the range (their handles stay until released).
    for (auto r = t.regions.lower_bound(ptr); r != t.regions.end() && r->first < ptr + size;) {
      if (r->second.kind == region_kind::vmm_mapping) {
        trace("cuMemAddressFree: range still had a mapping at 0x%llx", static_cast<unsigned long long>(r->first));
        auto& h = handles();
        const std::uint64_t id = r->second.handle;
        if (auto p = h.find(id); p != h.end()) --p->second.mappings;
        r = t.regions.erase(r);
        drop_if_unused(id);
      } else {
        ++r;
      }
    }
    munmap(reinterpret_cast<void*>(ptr), size);
    t.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

// With VMMCKPT_EMU_DIRTY_MEMORY, new device memory full of 0xa5 bytes; otherwise left as the memfd gives it.
static bool make_dirty(int fd, std::size_t size) {
  if (!settings().dirty_memory) return true;
  static const std::vector<unsigned char> pattern(std::size_t{1} << 20, 0xa5);
  for (std::size_t at = 0; at < size;) {
    const std::size_t n = std::min(pattern.size(), size - at);
    const ssize_t w = pwrite(fd, pattern.data(), n, static_cast<off_t>(at));
    if (w <= 0) return false;
    at += static_cast<std::size_t>(w);
  }
  return true;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == nullptr || size == 0 || !aligned(size) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return rc;
    const bool host = host_location(prop->location.type);
    const int dev = host ? 0 : prop->location.id;
    if (!host && !charge_device_memory(dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
    // The name carries the device so that an importing process can tell which device it belongs to.
    char name[32];
    if (host)
      std::snprintf(name, sizeof name, "vmmckpt-emu-host");
    else
      std::snprintf(name, sizeof name, "vmmckpt-emu-dev%d", dev);
    const int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0 || (!host && !make_dirty(fd, size))) {
      if (fd >= 0) close(fd);
      if (!host) refund_device_memory(dev, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    const std::uint64_t id = g_next_handle++;
    physical p;
    p.fd = fd;
    p.size = size;
    p.device = dev;
    p.host = host;
    p.prop = *prop;
    handles().emplace(id, p);
    *handle = id;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    auto it = handles().find(handle);
    if (it == handles().end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    --it->second.refs;
    drop_if_unused(handle);
    return CUDA_SUCCESS;
  });
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    region* r = t.find(reinterpret_cast<std::uintptr_t>(addr));
    if (r == nullptr || r->kind != region_kind::vmm_mapping) return CUDA_ERROR_INVALID_VALUE;
    auto it = handles().find(r->handle);
    if (it == handles().end()) return CUDA_ERROR_INVALID_VALUE;
    ++it->second.refs;
    *handle = r->handle;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ptr == 0 || size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset) || flags != 0 ||
        ptr + size < ptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    auto it = handles().find(handle);
    if (it == handles().end() || it->second.refs == 0) return CUDA_ERROR_INVALID_HANDLE;
    physical& p = it->second;
    if (offset > p.size || size > p.size - offset) return CUDA_ERROR_INVALID_VALUE;
    reservation* res = t.find_reservation(ptr);
    if (res == nullptr || ptr + size > res->base + res->size) return CUDA_ERROR_INVALID_VALUE;
    if (t.overlaps(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
    // PROT_NONE until cuMemSetAccess: a mapped range is not accessible by anyone yet.
    void* got =
        mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, p.fd, static_cast<off_t>(offset));
    if (got == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    region r;
    r.base = ptr;
    r.size = size;
    r.mapped = size;
    r.kind = region_kind::vmm_mapping;
    r.device = p.device;
    r.host_located = p.host;
    r.handle = handle;
    r.offset = offset;
    r.buffer_id = t.next_buffer_id++;
    t.regions.emplace(ptr, r);
    ++p.mappings;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ptr == 0 || size == 0 || !aligned(ptr) || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    std::vector<region*> parts;
    if (!whole_mappings(t, ptr, size, parts)) return CUDA_ERROR_INVALID_VALUE;
    for (region* r : parts) {
      const std::uint64_t id = r->handle;
      const std::uintptr_t base = r->base;
      restore_reservation(*r);
      t.regions.erase(base);
      drop_if_unused(id);
    }
    return CUDA_SUCCESS;
  });
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (ptr == 0 || size == 0 || !aligned(ptr) || !aligned(size) || desc == nullptr || count == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult rc = check_access(desc, count); rc != CUDA_SUCCESS) return rc;
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    std::vector<region*> parts;
    if (!whole_mappings(t, ptr, size, parts)) return CUDA_ERROR_INVALID_VALUE;
    for (region* r : parts)
      if (CUresult rc = set_access(*r, desc, count); rc != CUDA_SUCCESS) return rc;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult rc = check_location(*location); rc != CUDA_SUCCESS) return rc;
    auto& t = memory();
    std::shared_lock lock(t.mutex);
    region* r = t.find(ptr);
    if (r == nullptr || r->kind != region_kind::vmm_mapping) return CUDA_ERROR_INVALID_VALUE;
    *flags = location->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? r->host_access
                                                              : r->access[static_cast<std::size_t>(location->id)];
    return CUDA_SUCCESS;
  });
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& t = memory();
    std::shared_lock lock(t.mutex);
    auto it = handles().find(handle);
    if (it == handles().end()) return CUDA_ERROR_INVALID_VALUE;
    *prop = it->second.prop;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      trace("cuMemExportToShareableHandle: handle type %d is not emulated", static_cast<int>(handleType));
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    auto& t = memory();
    std::shared_lock lock(t.mutex);
    auto it = handles().find(handle);
    if (it == handles().end()) return CUDA_ERROR_INVALID_VALUE;
    // Like the real driver, only handles created exportable can be exported.
    if ((it->second.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // A new descriptor for the caller to own (and close), as the real driver gives.
    const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareableHandle) = fd;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                        CUmemAllocationHandleType shHandleType) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
      trace("cuMemImportFromShareableHandle: handle type %d is not emulated", static_cast<int>(shHandleType));
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // The POSIX handle is passed by value in the pointer, like the real API.
    const int in_fd = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
    struct stat st {};
    if (in_fd < 0 || fstat(in_fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
    const auto size = static_cast<std::size_t>(st.st_size);
    const int found = device_of_memfd(in_fd);
    const bool host = found == host_memfd;
    const int dev = host ? 0 : found;
    if (dev < 0 || size == 0 || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;  // not one of ours
    if (dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    // Our own copy: the caller keeps (and closes) the descriptor it passed in.
    const int fd = fcntl(in_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    auto& t = memory();
    std::unique_lock lock(t.mutex);
    physical p;
    p.fd = fd;
    p.size = size;
    p.device = dev;
    p.host = host;
    p.imported = true;
    p.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.prop.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    p.prop.location.id = dev;
    p.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    const std::uint64_t id = g_next_handle++;
    handles().emplace(id, p);
    *handle = id;
    return CUDA_SUCCESS;
  });
}

}  // extern "C"
