// Creates, maps and releases the physical handles under a pool.
#include "memory/cuda_backend.hpp"

#include "core/context_scope.hpp"
#include "core/gate.hpp"
#include "vmmckpt/support/log.hpp"
#include "core/real_symbols.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::detail {

CUmemAllocationProp cuda_backend::allocation_properties(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  // Exportable as a file descriptor: the checkpoint tool maps the same memory.
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc cuda_backend::read_write_from(int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

int cuda_backend::map_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t& handle) {
  const driver_api& d = *driver();
  context_scope scope(d, primary_);
  const CUmemAllocationProp prop = allocation_properties(device_);
  CUmemGenericAllocationHandle h = 0;
  CUresult r = d.cuMemCreate(&h, size, &prop, 0);
  if (r != CUDA_SUCCESS) {
    log::debug("cuMemCreate({} bytes) failed: {}", size, static_cast<int>(r));
    return r;
  }
  r = d.cuMemMap(addr, size, 0, h, 0);
  if (r == CUDA_SUCCESS) {
    // The owner first, then every device granted access so far (peer access, cross-device copies):
    // one call, so the segment is never visible without them.
    CUmemAccessDesc access[max_devices];
    std::size_t count = 0;
    access[count++] = read_write_from(device_);
    const std::uint32_t peers = peers_.load(std::memory_order_acquire);
    for (int peer = 0; peer < max_devices; ++peer)
      if ((peers >> peer & 1U) != 0 && peer != device_) access[count++] = read_write_from(peer);
    r = d.cuMemSetAccess(addr, size, access, count);
    if (r != CUDA_SUCCESS && count > 1) {
      // Without the peers the memory is still the program's own device's: the allocation need not fail.
      log::warn("device {}: access for peer devices {:#x} refused (error {}); the segment at {:#x} is this "
                "device's only",
                device_, peers, static_cast<int>(r), addr);
      r = d.cuMemSetAccess(addr, size, access, 1);
    }
    if (r != CUDA_SUCCESS) d.cuMemUnmap(addr, size);
  }
  if (r != CUDA_SUCCESS) {
    log::warn("mapping {} bytes of pool memory at {:#x} failed: {}", size, addr, static_cast<int>(r));
    d.cuMemRelease(h);
    return r;
  }
  handle = h;
  log::debug("device {}: mapped {} MiB at {:#x}", device_, size >> 20, addr);
  return CUDA_SUCCESS;
}

CUresult cuda_backend::grant_existing(const device_pool& pool, CUdevice peer) {
  const driver_api& d = *driver();
  context_scope scope(d, primary_);
  const CUmemAccessDesc access = read_write_from(peer);
  CUresult first = CUDA_SUCCESS;
  pool.with_segments([&](const segment_info& s) {
    const CUresult r = d.cuMemSetAccess(s.addr, s.size, &access, 1);
    if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = r;
  });
  return first;
}

void cuda_backend::unmap_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t handle) {
  const driver_api& d = *driver();
  context_scope scope(d, primary_);
  const CUresult unmapped = d.cuMemUnmap(addr, size);
  const CUresult released = d.cuMemRelease(handle);
  if (unmapped != CUDA_SUCCESS || released != CUDA_SUCCESS)
    log::warn("giving back {} bytes at {:#x} failed: unmap {}, release {}", size, addr, static_cast<int>(unmapped),
              static_cast<int>(released));
  else
    log::debug("device {}: gave back {} MiB at {:#x}", device_, size >> 20, addr);
}

// Every call that can submit GPU work passes the gate: how many have returned is the work submitted.
std::uint64_t cuda_backend::submitted_work() const { return the_gate().submitted(); }

void cuda_backend::synchronize() {
  const driver_api& d = *driver();
  if (d.cuCtxSynchronize_v2 != nullptr && d.cuCtxSynchronize_v2(primary_) == CUDA_SUCCESS) return;
  context_scope scope(d, primary_);
  d.cuCtxSynchronize();
}

}  // namespace vmmckpt::detail
