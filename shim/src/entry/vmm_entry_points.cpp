// The VMM doors: device memory a program maps itself (cuMemCreate and its family) is owned by the shim.
//
// Reservations land at addresses of ours (the device's VMM window), the program sees tokens instead of
// the driver's handles, and every mapping and access change is recorded, so that a later dump or
// suspend can save the memory and put it back at the same addresses (docs/vmm.md). Memory on host
// locations, of other types, and imported handles pass through and are only counted.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/callers.hpp"
#include "entry/entry_points.hpp"
#include "core/gate.hpp"
#include "operations/restore.hpp"
#include "memory/memory_tags.hpp"
#include "memory/vmm_checkpoint.hpp"
#include "memory/vmm_sharing.hpp"
#include "memory/vmm_state.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::detail {
namespace {

vmm_state& state() { return vmm_state_for_recording(); }
vmm_state* existing_state() { return existing_vmm_state(); }

// Pinned memory on a device or a host location (NCCL's host buffers) is the shim's: tokens, mappings,
// images. Anything else passes through.
bool owned(const CUmemAllocationProp& prop) {
  return prop.type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE || is_host_location(prop.location.type));
}

vmm_not_owned_kind kind_of(const CUmemAllocationProp& prop) {
  return is_host_location(prop.location.type) ? vmm_not_owned_kind::host : vmm_not_owned_kind::other;
}

// Creates memory the driver would not make exportable as a POSIX FD: it passes through, counted.
CUresult create_not_owned(const driver_api& d, vmm_state& s, CUmemGenericAllocationHandle* handle, size_t size,
                          const CUmemAllocationProp* prop, unsigned long long flags) {
  VMMCKPT_NOT_SERVED("VMM memory of a type the shim does not own, or that the driver cannot export (cuMemCreate)");
  gate_scope scope(gate_scope::no_work);
  const CUresult e = d.cuMemCreate(handle, size, prop, flags);
  if (e == CUDA_SUCCESS) {
    std::lock_guard lock(s.mutex);
    s.registry.add_not_owned(*handle, kind_of(*prop), size);
  }
  return e;
}

// A live token's driver handle, an import token's (docs/job-checkpoint.md); any other value is the driver's own
// and is passed on unchanged.
CUmemGenericAllocationHandle real_handle(vmm_state& s, CUmemGenericAllocationHandle handle) {
  if (looks_like_import_token(handle)) return s.registry.driver_value(handle);
  if (!looks_like_vmm_token(handle)) return handle;
  const vmm_handle* h = s.registry.live_handle(handle);
  return h != nullptr ? h->real : handle;
}

// A value of our token forms with no live record (released, or never handed out), or an import given back. No
// driver ever made such a value (it is no canonical pointer), and a real driver may fault on one it does not
// know, so the shim answers for it: CUDA_ERROR_INVALID_VALUE, as the driver answers for a handle it does not have.
bool dead_token(const vmm_state& s, CUmemGenericAllocationHandle handle) {
  if (looks_like_import_token(handle)) return s.registry.driver_value(handle) == 0;
  return looks_like_vmm_token(handle) && s.registry.live_handle(handle) == nullptr;
}

// A value the shim stands behind: an owned handle's token or an import's.
bool token_of_ours(CUmemGenericAllocationHandle handle) {
  return looks_like_vmm_token(handle) || looks_like_import_token(handle);
}

// Gives the driver back the handles whose records went (the registry held one reference on each).
void release_real(const driver_api& d, const std::vector<std::uint64_t>& handles) {
  for (const std::uint64_t real : handles)
    if (const CUresult e = d.cuMemRelease(real); e != CUDA_SUCCESS)
      log::warn("cuMemRelease of driver handle {:#x} failed: error {}", real, static_cast<int>(e));
}

// Tells the exporters of imports whose last reference and mapping just went; the registry's lock is let go
// first (they are other processes, asked over their sockets).
void unshare_dropped(vmm_state& s, std::unique_lock<std::mutex>& lock) {
  std::vector<vmm_import> dropped = s.registry.take_dropped_imports();
  if (dropped.empty()) return;
  lock.unlock();
  tell_unshared(dropped);
}

// The device whose window a reservation goes to: the current context's; device 0 without one (a
// reservation needs only cuInit).
int reservation_device() {
  int ordinal = 0;
  if (current_device(ordinal) != CUDA_SUCCESS) ordinal = 0;
  return ordinal;
}

}  // namespace


}  // namespace vmmckpt::detail

using namespace vmmckpt;
using namespace vmmckpt::detail;

namespace {

// A restored image's VMM memory is in place before the program's first VMM call; after a failed restore
// every memory call fails, as the pool's do.
bool restore_failed() noexcept { return shim_active() && !restore_ready(); }

// The start every recording VMM entry point shares: the driver there, no failed restore, and this process's
// VMM state when the shim records and the call is `ours` (else the driver's own call, `pass`). `body` runs with
// the gate open for no work and the state locked.
template <typename Pass, typename Body>
CUresult with_recorded_state(bool ours, Pass&& pass, Body&& body) noexcept {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_state* s = ours && shim_active() ? existing_state() : nullptr;
    if (s == nullptr) return pass(&d);
    gate_scope scope(gate_scope::no_work);
    std::unique_lock lock(s->mutex);
    return body(&d, s, lock);
  });
}

}  // namespace

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                                    unsigned long long flags) {
  return with_driver(CUDA_ERROR_OUT_OF_MEMORY, [&](const driver_api& d) {
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!shim_active() || ptr == nullptr || size == 0) return d.cuMemAddressReserve(ptr, size, alignment, addr, flags);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;  // the driver defines no flag yet
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
    if (!reserve_windows(s, device).ok()) return CUDA_ERROR_OUT_OF_MEMORY;
    std::uint64_t ours = 0;
    const vmm_status placed = s.registry.reserve(device, size, alignment, addr, ours);
    if (placed == vmm_status::invalid_value) return CUDA_ERROR_INVALID_VALUE;
    if (placed != vmm_status::ok) {
      log::error("cuMemAddressReserve of {} bytes: no room left in device {}'s VMM window [{:#x}, {:#x}) "
                 "(VMMCKPT_VMM_WINDOW)",
                 size, device, s.config.device_base(device), s.config.device_base(device) + s.config.window);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // A hint may have placed it in another device's window, which must be reserved too.
    const int window = static_cast<int>((ours - s.config.base) / s.config.window);
    if (window != device && (window >= max_devices || s.windows[window] != CUDA_SUCCESS)) {
      std::vector<std::uint64_t> none;
      s.registry.free_reservation(ours, size, none);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // Carved out of the window the driver reserved whole: no driver call, so the driver cannot move it.
    *ptr = ours;
    log::at(log::level::trace, "cuMemAddressReserve {} bytes (hint {:#x}) -> {:#x}", size,
            static_cast<std::uint64_t>(addr), ours);
    return CUDA_SUCCESS;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return with_recorded_state(
      true, [&](const driver_api* d) { return d->cuMemAddressFree(ptr, size); },
      [&](const driver_api* d, vmm_state* s, std::unique_lock<std::mutex>& lock) {
        const vmm_status st = s->registry.check_free(ptr, size);
        if (st == vmm_status::not_found) return d->cuMemAddressFree(ptr, size);
        if (st != vmm_status::ok) return CUDA_ERROR_INVALID_VALUE;
        // The window stays reserved with the driver: what the program left mapped in the range goes now, as
        // the driver would drop it with a range of its own.
        for (const auto& [addr, bytes] : s->registry.mapped_in(ptr, vmm_span(size)))
          if (const CUresult e = d->cuMemUnmap(addr, bytes); e != CUDA_SUCCESS)
            log::warn("cuMemAddressFree: unmapping {:#x}+{} left mapped in the range failed: error {}", addr, bytes,
                      static_cast<int>(e));
        std::vector<std::uint64_t> released;
        s->registry.free_reservation(ptr, size, released);
        release_real(*d, released);
        unshare_dropped(*s, lock);
        return CUDA_SUCCESS;
      });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                            const CUmemAllocationProp* prop, unsigned long long flags) {
  const void* caller = __builtin_return_address(0);
  return with_driver(CUDA_ERROR_OUT_OF_MEMORY, [&](const driver_api& d) {
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!shim_active() || handle == nullptr || prop == nullptr) return d.cuMemCreate(handle, size, prop, flags);
    vmm_state& s = state();
    if (!owned(*prop)) return create_not_owned(d, s, handle, size, prop, flags);
    // What callers get on machines without fabric: PyTorch, XLA and NCCL fall back to POSIX FDs.
    if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) != 0) {
      log::debug("cuMemCreate with FABRIC handles: not supported under vmmckpt");
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    // A POSIX FD lets the checkpoint tool map the same memory; the program's own request is kept for
    // cuMemGetAllocationPropertiesFromHandle and export.
    CUmemAllocationProp real_prop = *prop;
    real_prop.requestedHandleTypes =
        static_cast<CUmemAllocationHandleType>(prop->requestedHandleTypes | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    const bool host = is_host_location(prop->location.type);
    CUmemGenericAllocationHandle real = 0;
    CUresult e = CUDA_SUCCESS;
    {
      gate_scope scope(gate_scope::no_work);
      e = d.cuMemCreate(&real, size, &real_prop, flags);
    }
    // A host location the driver cannot export (an older driver) stays the program's as it asked.
    if (host && e != CUDA_SUCCESS && e != CUDA_ERROR_OUT_OF_MEMORY)
      return create_not_owned(d, s, handle, size, prop, flags);
    if (e != CUDA_SUCCESS) return e;  // out of memory stays exactly that: callers free caches and retry on it
    gate_scope scope(gate_scope::no_work);
    vmm_properties program;
    std::memcpy(program.bytes.data(), prop, sizeof *prop);
    // Host memory is copied through the device of the calling thread's context.
    const int device = host ? reservation_device() : prop->location.id;
    std::uint64_t token = 0;
    {
      std::lock_guard lock(s.mutex);
      try {
        token = s.registry.add_handle(real, size, device, flags, program);
        if (token != 0 && called_from_nccl(caller)) s.nccl_tokens.insert(token);
      } catch (...) {
        token = 0;
      }
    }
    if (token == 0) {
      d.cuMemRelease(real);
      log::warn("cuMemCreate: no memory (or no token left) to record the handle; the creation fails");
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = token;
    if (any_memory_tagged.load(std::memory_order_relaxed))
      tag_new(tagged_kind::vmm_handle, token, [&](std::uint64_t t) {
        std::lock_guard lock(s.mutex);
        return s.registry.live_handle(t) != nullptr;
      });
    log::at(log::level::trace, "cuMemCreate {} bytes on device {} -> token {:#x}", size, prop->location.id, token);
    return CUDA_SUCCESS;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return with_recorded_state(
      true, [&](const driver_api* d) { return d->cuMemRelease(handle); },
      [&](const driver_api* d, vmm_state* s, std::unique_lock<std::mutex>& lock) {
        if (looks_like_vmm_token(handle)) {
          std::vector<std::uint64_t> released;
          const vmm_status st = s->registry.release(handle, released);
          if (st != vmm_status::not_found) {
            release_real(*d, released);
            return st == vmm_status::ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
          }
          return CUDA_ERROR_INVALID_VALUE;  // dead_token(): never the driver's
        }
        if (looks_like_import_token(handle) && !s->registry.knows_import(handle)) return CUDA_ERROR_INVALID_VALUE;
        // An import given back (a job's rank whose peers' memory could not be mapped again) has no driver
        // reference left to drop: only the program's goes.
        const std::uint64_t real = s->registry.driver_value(handle);
        const CUresult e = real == 0 ? CUDA_SUCCESS : d->cuMemRelease(real);
        if (e == CUDA_SUCCESS) s->registry.release_not_owned(handle);
        unshare_dropped(*s, lock);
        return e;
      });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return with_recorded_state(
      true, [&](const driver_api* d) { return d->cuMemMap(ptr, size, offset, handle, flags); },
      [&](const driver_api* d, vmm_state* s, std::unique_lock<std::mutex>&) {
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
          log::warn("cuMemMap at {:#x}: the driver mapped over a range recorded as mapped",
                    static_cast<std::uint64_t>(ptr));
        return CUDA_SUCCESS;
      });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return with_recorded_state(
      true, [&](const driver_api* d) { return d->cuMemUnmap(ptr, size); },
      [&](const driver_api* d, vmm_state* s, std::unique_lock<std::mutex>& lock) {
        const CUresult e = d->cuMemUnmap(ptr, size);
        if (e != CUDA_SUCCESS) return e;
        std::vector<std::uint64_t> released;
        s->registry.unmap(ptr, size, released);
        release_real(*d, released);
        unshare_dropped(*s, lock);
        return CUDA_SUCCESS;
      });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                               size_t count) {
  return with_recorded_state(
      true, [&](const driver_api* d) { return d->cuMemSetAccess(ptr, size, desc, count); },
      [&](const driver_api* d, vmm_state* s, std::unique_lock<std::mutex>&) {
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

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                               CUdeviceptr ptr) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    return d.cuMemGetAccess(flags, location, ptr);  // addresses are the driver's too: nothing to translate
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    if (restore_failed()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (d.cuMemRetainAllocationHandle == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    vmm_state* s = shim_active() && handle != nullptr ? existing_state() : nullptr;
    if (s == nullptr) return d.cuMemRetainAllocationHandle(handle, addr);
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s->mutex);
    std::uint64_t token = 0;
    if (s->registry.retain_at(reinterpret_cast<std::uint64_t>(addr), token) == vmm_status::ok) {
      *handle = token;
      return CUDA_SUCCESS;
    }
    const CUresult e = d.cuMemRetainAllocationHandle(handle, addr);
    if (e != CUDA_SUCCESS) return e;
    if (const auto token = s->registry.import_token_of(*handle)) *handle = *token;  // the value the program knows
    s->registry.retain_not_owned(*handle);
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                                       CUmemGenericAllocationHandle handle) {
  return with_recorded_state(
      token_of_ours(handle),
      [&](const driver_api* d) { return d->cuMemGetAllocationPropertiesFromHandle(prop, handle); },
      [&](const driver_api* d, vmm_state* s, std::unique_lock<std::mutex>&) {
        if (looks_like_import_token(handle))
          return dead_token(*s, handle) ? CUDA_ERROR_INVALID_VALUE
                                        : d->cuMemGetAllocationPropertiesFromHandle(prop, real_handle(*s, handle));
        // a suspended program's handles have no driver handle under them
        const vmm_handle* h = s->registry.live_handle(handle);
        if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;  // dead_token(): never the driver's
        const CUresult e = d->cuMemGetAllocationPropertiesFromHandle(prop, h->real);
        // The driver knows the POSIX FD the shim added; the program sees what it asked for.
        if (e == CUDA_SUCCESS && prop != nullptr)
          prop->requestedHandleTypes = program_properties(*h).requestedHandleTypes;
        return e;
      });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                             CUmemAllocationHandleType type, unsigned long long flags) {
  return with_recorded_state(
      token_of_ours(handle),
      [&](const driver_api* d) { return d->cuMemExportToShareableHandle(shareable, handle, type, flags); },
      [&](const driver_api* d, vmm_state* s, std::unique_lock<std::mutex>&) {
        if (looks_like_import_token(handle))  // another process's memory: its exporter says what it is
          return dead_token(*s, handle)
                     ? CUDA_ERROR_INVALID_VALUE
                     : d->cuMemExportToShareableHandle(shareable, real_handle(*s, handle), type, flags);
        // a suspended program's handles have no driver handle under them
        const vmm_handle* h = s->registry.live_handle(handle);
        if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;  // dead_token(): never the driver's
        // A type the program did not ask for is refused, as the driver refuses it (the FD is ours).
        if ((program_properties(*h).requestedHandleTypes & type) == 0) return CUDA_ERROR_INVALID_VALUE;
        const CUresult e = d->cuMemExportToShareableHandle(shareable, h->real, type, flags);
        if (e == CUDA_SUCCESS && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && shareable != nullptr)
          note_export(handle, *static_cast<int*>(shareable));  // so that an importer can ask which handle it is
        return e;
      });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                               CUmemAllocationHandleType type) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    if (!shim_active() || handle == nullptr) return d.cuMemImportFromShareableHandle(handle, os_handle, type);
    // Another process's memory: it is that process's to save. Its exporter says which handle it is, so that
    // an image records the import (and a restore can map it again); otherwise counted by what is mapped.
    std::optional<vmm_import> origin;
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      origin = identify_import(static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle)));
    const CUresult e = d.cuMemImportFromShareableHandle(handle, os_handle, type);
    if (e != CUDA_SUCCESS) return e;
    if (!origin)
      VMMCKPT_NOT_SERVED(
          "VMM memory imported from a process that does not say what it is (cuMemImportFromShareableHandle)");
    vmm_state& s = state();
    gate_scope scope(gate_scope::no_work);
    std::lock_guard lock(s.mutex);
    if (origin)
      *handle = s.registry.add_import(*handle, *origin);
    else
      s.registry.add_not_owned(*handle, vmm_not_owned_kind::imported, 0);
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                              CUmemAllocationGranularity_flags option) {
  return with_driver(CUDA_ERROR_UNKNOWN,
                     [&](const driver_api& d) { return d.cuMemGetAllocationGranularity(granularity, prop, option); });
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
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    const CUresult e = d.cuDeviceGetAttribute(value, attribute, device);
    if (e == CUDA_SUCCESS && value != nullptr && attribute == CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED && shim_active())
      *value = 0;
    return e;
  });
}
