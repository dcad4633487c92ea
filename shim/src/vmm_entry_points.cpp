// The VMM doors: device memory a program maps itself (cuMemCreate and its family) is owned by the shim.
//
// Reservations land at addresses of ours (the device's VMM window), the program sees tokens instead of
// the driver's handles, and every mapping and access change is recorded, so that a later dump or
// suspend can save the memory and put it back at the same addresses (docs/vmm.md). Memory on host
// locations, of other types, and imported handles pass through and are only counted.
#include <cuda.h>
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "entry_points.hpp"
#include "gate.hpp"
#include "restore_at_start.hpp"
#include "vmm_checkpoint.hpp"
#include "vmm_entry_points.hpp"
#include "vmm_state.hpp"
#include "vmmckpt/pool_layout.hpp"

namespace vmmckpt::detail {
namespace {

void before_fork() {
  if (vmm_state* s = existing_vmm_state()) s->mutex.lock();
}
void after_fork_in_parent() {
  if (vmm_state* s = existing_vmm_state()) s->mutex.unlock();
}
void after_fork_in_child() {
  after_fork_in_parent();
  // The parent's tokens name driver handles the child cannot use: step aside, as after pools.
  if (existing_vmm_state() != nullptr) step_aside_in_child();
}

std::atomic<vmm_state*> g_state{nullptr};

vmm_state& state() { return vmm_state_for_recording(); }
vmm_state* existing_state() { return existing_vmm_state(); }

bool owned(const CUmemAllocationProp& prop) {
  return prop.type == CU_MEM_ALLOCATION_TYPE_PINNED && prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
}

vmm_not_owned_kind kind_of(const CUmemAllocationProp& prop) {
  const CUmemLocationType t = prop.location.type;
  return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                 t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT
             ? vmm_not_owned_kind::host
             : vmm_not_owned_kind::other;
}

// A live token's driver handle; any other value is the driver's own and is passed on unchanged.
CUmemGenericAllocationHandle real_handle(vmm_state& s, CUmemGenericAllocationHandle handle) {
  if (!looks_like_vmm_token(handle)) return handle;
  const vmm_handle* h = s.registry.live_handle(handle);
  return h != nullptr ? h->real : handle;
}

// A value of our token form with no live record (released, or never handed out). No driver ever made
// such a value (it is no canonical pointer), and a real driver may fault on one it does not know, so the
// shim answers for it: CUDA_ERROR_INVALID_VALUE, as the driver answers for a handle it does not have.
bool dead_token(const vmm_state& s, CUmemGenericAllocationHandle handle) {
  return looks_like_vmm_token(handle) && s.registry.live_handle(handle) == nullptr;
}

// Gives the driver back the handles whose records went (the registry held one reference on each).
void release_real(const driver_api& d, const std::vector<std::uint64_t>& handles) {
  for (const std::uint64_t real : handles)
    if (const CUresult e = d.cuMemRelease(real); e != CUDA_SUCCESS)
      log::warn("cuMemRelease of driver handle {:#x} failed: error {}", real, static_cast<int>(e));
}

// The device whose window a reservation goes to: the current context's; device 0 without one (a
// reservation needs only cuInit).
int reservation_device() {
  int ordinal = 0;
  if (current_device(ordinal) != CUDA_SUCCESS) ordinal = 0;
  return ordinal;
}

}  // namespace

vmm_state& vmm_state_for_recording() {
  static vmm_state* const created = [] {
    std::string pool_error, error;
    const pool_config pools = pool_config_from_env(pool_error);
    const vmm_config config = vmm_config_from_env(pools, error);
    auto* s = new vmm_state(config, error);
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    g_state.store(s, std::memory_order_release);
    return s;
  }();
  return *created;
}

vmm_state* existing_vmm_state() { return g_state.load(std::memory_order_acquire); }

vmm_not_owned_bytes not_owned_vmm_bytes() {
  vmm_state* s = existing_state();
  if (s == nullptr) return {};
  std::lock_guard lock(s->mutex);
  vmm_not_owned_bytes bytes = s->registry.not_owned_bytes();
  bytes.unmapped = s->registry.unmapped_handle_bytes();
  return bytes;
}

}  // namespace vmmckpt::detail

using namespace vmmckpt;
using namespace vmmckpt::detail;

namespace {

// A restored image's VMM memory is in place before the program's first VMM call; after a failed restore
// every memory call fails, as the pool's do.
bool restore_failed() noexcept { return shim_active() && !restore_ready(); }

}  // namespace

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                                    unsigned long long flags) {
  return guarded(CUDA_ERROR_OUT_OF_MEMORY, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!shim_active() || ptr == nullptr || size == 0) return d->cuMemAddressReserve(ptr, size, alignment, addr, flags);
    vmm_state& s = state();
    if (!s.config_error.empty()) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) log::error("{}; every cuMemAddressReserve fails", s.config_error);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const int device = reservation_device();
    if (device < 0 || device >= max_devices) {
      log::error("cuMemAddressReserve on device {}: vmmckpt serves devices 0 to {}", device, max_devices - 1);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s.mutex);
    std::uint64_t ours = 0;
    const vmm_status placed = s.registry.reserve(device, size, alignment, addr, ours);
    if (placed == vmm_status::invalid_value) return CUDA_ERROR_INVALID_VALUE;
    if (placed != vmm_status::ok) {
      log::error("cuMemAddressReserve of {} bytes: no room left in device {}'s VMM window [{:#x}, {:#x}) "
                 "(VMMCKPT_VMM_WINDOW)",
                 size, device, s.config.device_base(device), s.config.device_base(device) + s.config.window);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    std::vector<std::uint64_t> none;
    CUdeviceptr got = 0;
    const CUresult e = d->cuMemAddressReserve(&got, size, alignment, ours, flags);
    if (e != CUDA_SUCCESS) {
      s.registry.free_reservation(ours, size, none);
      return e;
    }
    if (got != ours) {
      // The driver keeps some room after a large reservation (an H100 rounds 89 GB up to 32 MiB) and
      // moves a reservation that would start in it. Where it moved it inside our window, to a range we
      // have free, that address is ours too: the same calls meet the same driver in every run, and a
      // restore asks for each range exactly.
      std::uint64_t moved = 0;
      s.registry.free_reservation(ours, size, none);
      if (s.registry.reserve(device, size, alignment, got, moved) == vmm_status::ok) {
        if (moved == got) {
          *ptr = got;
          log::at(log::level::trace, "cuMemAddressReserve {} bytes -> {:#x} (the driver's, after {:#x})", size,
                  static_cast<std::uint64_t>(got), ours);
          return CUDA_SUCCESS;
        }
        s.registry.free_reservation(moved, size, none);
      }
      // Elsewhere an address could never be restored, so the reservation is refused.
      d->cuMemAddressFree(got, size);
      log::error("cuMemAddressReserve: [{:#x}, {:#x}) in device {}'s VMM window is taken in this process (the "
                 "driver offered {:#x}); set VMMCKPT_VMM_BASE to a free range",
                 ours, ours + size, device, static_cast<std::uint64_t>(got));
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = got;
    log::at(log::level::trace, "cuMemAddressReserve {} bytes (hint {:#x}) -> {:#x}", size,
            static_cast<std::uint64_t>(addr), ours);
    return CUDA_SUCCESS;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = shim_active() ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemAddressFree(ptr, size);
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s->mutex);
    const vmm_status st = s->registry.check_free(ptr, size);
    if (st == vmm_status::not_found) return d->cuMemAddressFree(ptr, size);
    if (st != vmm_status::ok) return CUDA_ERROR_INVALID_VALUE;
    const CUresult e = d->cuMemAddressFree(ptr, size);
    if (e != CUDA_SUCCESS) return e;
    std::vector<std::uint64_t> released;
    s->registry.free_reservation(ptr, size, released);
    release_real(*d, released);
    return CUDA_SUCCESS;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                            const CUmemAllocationProp* prop, unsigned long long flags) {
  return guarded(CUDA_ERROR_OUT_OF_MEMORY, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!shim_active() || handle == nullptr || prop == nullptr) return d->cuMemCreate(handle, size, prop, flags);
    vmm_state& s = state();
    if (!owned(*prop)) {
      VMMCKPT_NOT_SERVED("VMM memory on a host location or of a type the shim does not own (cuMemCreate)");
      gate_scope scope(gate_scope::no_work);
      const CUresult e = d->cuMemCreate(handle, size, prop, flags);
      if (e == CUDA_SUCCESS) {
        std::lock_guard lock(s.mutex);
        s.registry.add_not_owned(*handle, kind_of(*prop), size);
      }
      return e;
    }
    // What callers get on machines without fabric: PyTorch, XLA and NCCL fall back to POSIX FDs.
    if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) != 0) {
      log::debug("cuMemCreate with FABRIC handles: not supported under vmmckpt");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // A POSIX FD lets the checkpoint tool map the same memory; the program's own request is kept for
    // cuMemGetAllocationPropertiesFromHandle and export.
    CUmemAllocationProp real_prop = *prop;
    real_prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(
        prop->requestedHandleTypes | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    gate_scope scope(gate_scope::no_work);
    CUmemGenericAllocationHandle real = 0;
    const CUresult e = d->cuMemCreate(&real, size, &real_prop, flags);
    if (e != CUDA_SUCCESS) return e;  // out of memory stays exactly that: callers free caches and retry on it
    vmm_properties program;
    std::memcpy(program.bytes.data(), prop, sizeof *prop);
    std::uint64_t token = 0;
    {
      std::lock_guard lock(s.mutex);
      try {
        token = s.registry.add_handle(real, size, prop->location.id, flags, program);
      } catch (...) {
        token = 0;
      }
    }
    if (token == 0) {
      d->cuMemRelease(real);
      log::warn("cuMemCreate: no memory (or no token left) to record the handle; the creation fails");
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = token;
    log::at(log::level::trace, "cuMemCreate {} bytes on device {} -> token {:#x}", size, prop->location.id, token);
    return CUDA_SUCCESS;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = shim_active() ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemRelease(handle);
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s->mutex);
    if (looks_like_vmm_token(handle)) {
      std::vector<std::uint64_t> released;
      const vmm_status st = s->registry.release(handle, released);
      if (st != vmm_status::not_found) {
        release_real(*d, released);
        return st == vmm_status::ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
      }
      return CUDA_ERROR_INVALID_VALUE;  // dead_token(): never the driver's
    }
    const CUresult e = d->cuMemRelease(handle);
    if (e == CUDA_SUCCESS) s->registry.release_not_owned(handle);
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                         unsigned long long flags) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = shim_active() ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemMap(ptr, size, offset, handle, flags);
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s->mutex);
    if (dead_token(*s, handle)) return CUDA_ERROR_INVALID_VALUE;
    const CUresult e = d->cuMemMap(ptr, size, offset, real_handle(*s, handle), flags);
    if (e != CUDA_SUCCESS) return e;
    vmm_status st = vmm_status::invalid_value;
    try {
      st = s->registry.map(ptr, size, offset, handle);
    } catch (...) {
      // Unrecorded memory could not be saved: the mapping is undone rather than left unknown.
      d->cuMemUnmap(ptr, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (st == vmm_status::invalid_value)
      log::warn("cuMemMap at {:#x}: the driver mapped over a range recorded as mapped", static_cast<std::uint64_t>(ptr));
    return CUDA_SUCCESS;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = shim_active() ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemUnmap(ptr, size);
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s->mutex);
    const CUresult e = d->cuMemUnmap(ptr, size);
    if (e != CUDA_SUCCESS) return e;
    std::vector<std::uint64_t> released;
    s->registry.unmap(ptr, size, released);
    release_real(*d, released);
    return CUDA_SUCCESS;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = shim_active() ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemSetAccess(ptr, size, desc, count);
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s->mutex);
    const CUresult e = d->cuMemSetAccess(ptr, size, desc, count);
    if (e != CUDA_SUCCESS || desc == nullptr || count == 0) return e;
    try {
      std::vector<vmm_access> access;
      access.reserve(count);
      for (std::size_t i = 0; i < count; ++i)
        access.push_back(vmm_access{static_cast<int>(desc[i].location.type), desc[i].location.id,
                                    static_cast<std::uint64_t>(desc[i].flags)});
      s->registry.set_access(ptr, size, access);
    } catch (...) {
      log::warn("cuMemSetAccess at {:#x}: no memory to record the access rights", static_cast<std::uint64_t>(ptr));
    }
    vmm_replay_fill(*s, ptr, size);  // a --replay restore's bytes, once the program made the mapping again
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    return d->cuMemGetAccess(flags, location, ptr);  // addresses are the driver's too: nothing to translate
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (d->cuMemRetainAllocationHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    vmm_state* s = shim_active() && handle != nullptr ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemRetainAllocationHandle(handle, addr);
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s->mutex);
    std::uint64_t token = 0;
    if (s->registry.retain_at(reinterpret_cast<std::uint64_t>(addr), token) == vmm_status::ok) {
      *handle = token;
      return CUDA_SUCCESS;
    }
    const CUresult e = d->cuMemRetainAllocationHandle(handle, addr);
    if (e == CUDA_SUCCESS) s->registry.retain_not_owned(*handle);
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                                       CUmemGenericAllocationHandle handle) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = shim_active() && looks_like_vmm_token(handle) ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemGetAllocationPropertiesFromHandle(prop, handle);
    gate_scope scope(gate_scope::no_work);  // a suspended program's handles have no driver handle under them
    std::lock_guard lock(s->mutex);
    const vmm_handle* h = s->registry.live_handle(handle);
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;  // dead_token(): never the driver's
    const CUresult e = d->cuMemGetAllocationPropertiesFromHandle(prop, h->real);
    // The driver knows the POSIX FD the shim added; the program sees what it asked for.
    if (e == CUDA_SUCCESS && prop != nullptr) prop->requestedHandleTypes = program_properties(*h).requestedHandleTypes;
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                             CUmemAllocationHandleType type, unsigned long long flags) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = shim_active() && looks_like_vmm_token(handle) ? existing_state() : nullptr;
    if (s == nullptr) return d->cuMemExportToShareableHandle(shareable, handle, type, flags);
    gate_scope scope(gate_scope::no_work);  // a suspended program's handles have no driver handle under them
    std::lock_guard lock(s->mutex);
    const vmm_handle* h = s->registry.live_handle(handle);
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;  // dead_token(): never the driver's
    // A type the program did not ask for is refused, as the driver refuses it (the FD is ours).
    if ((program_properties(*h).requestedHandleTypes & type) == 0) return CUDA_ERROR_INVALID_VALUE;
    return d->cuMemExportToShareableHandle(shareable, h->real, type, flags);
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                               CUmemAllocationHandleType type) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuMemImportFromShareableHandle(handle, os_handle, type);
    if (e != CUDA_SUCCESS || !shim_active() || handle == nullptr) return e;
    // Another process's memory: it is that process's to save. Counted by what is mapped of it here.
    VMMCKPT_NOT_SERVED("VMM memory imported from another process (cuMemImportFromShareableHandle)");
    vmm_state& s = state();
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s.mutex);
    s.registry.add_not_owned(*handle, vmm_not_owned_kind::imported, 0);
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                              CUmemAllocationGranularity_flags option) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    return d->cuMemGetAllocationGranularity(granularity, prop, option);
  });
}

// ---- multicast: off under the shim ------------------------------------------------------------------
// A multicast object spans processes and devices; nothing of it could be restored. NCCL uses NVLS only
// when cuMulticastCreate resolves and the device reports CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, and
// falls back otherwise: both say no here, and the driver's cuMulticastCreate is never called.

namespace {
template <typename Fn>
Fn real_driver_function(const char* name) {
  void* lib = driver_library();
  return lib != nullptr ? reinterpret_cast<Fn>(real_dlsym(lib, name)) : nullptr;
}
}  // namespace

VMMCKPT_EXPORT CUresult CUDAAPI cuMulticastCreate(CUmemGenericAllocationHandle* mc_handle,
                                                  const CUmulticastObjectProp* prop) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    if (shim_active()) return CUDA_ERROR_NOT_SUPPORTED;
    const auto real = real_driver_function<decltype(&::cuMulticastCreate)>("cuMulticastCreate");
    return real != nullptr ? real(mc_handle, prop) : CUDA_ERROR_NOT_SUPPORTED;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMulticastGetGranularity(size_t* granularity, const CUmulticastObjectProp* prop,
                                                          CUmulticastGranularity_flags option) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    if (shim_active()) return CUDA_ERROR_NOT_SUPPORTED;
    const auto real = real_driver_function<decltype(&::cuMulticastGetGranularity)>("cuMulticastGetGranularity");
    return real != nullptr ? real(granularity, prop, option) : CUDA_ERROR_NOT_SUPPORTED;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuDeviceGetAttribute(value, attribute, device);
    if (e == CUDA_SUCCESS && value != nullptr && attribute == CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED && shim_active())
      *value = 0;
    return e;
  });
}
