// Peer access on pool memory: cuCtxEnablePeerAccess and copies between devices grant the devices taking part
// access to the pools involved (VMM memory is reachable only from devices named in cuMemSetAccess).
#include "entry/peer_access.hpp"

#include <algorithm>
#include <array>

#include "core/context_scope.hpp"
#include "entry/entry_points.hpp"
#include "core/gate.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::detail {
namespace {

constexpr std::uint32_t bit(int device) { return 1U << device; }

// The devices cuDeviceCanAccessPeer lets reach each device's memory, asked once per device; bit 31: known.
constexpr std::uint32_t known = 1U << 31;
static_assert(max_devices < 31);
std::array<std::atomic<std::uint32_t>, max_devices> reachable_cache{};

std::uint32_t reachable_from(int owner) {
  const std::uint32_t cached = reachable_cache[owner].load(std::memory_order_acquire);
  if ((cached & known) != 0) return cached & ~known;
  const driver_api* d = driver();
  if (d == nullptr || d->cuDeviceCanAccessPeer == nullptr) return 0;
  int count = max_devices;
  if (d->cuDeviceGetCount == nullptr || d->cuDeviceGetCount(&count) != CUDA_SUCCESS) count = max_devices;
  std::uint32_t devices = 0;
  for (int device = 0; device < std::min(count, max_devices); ++device) {
    int can = 0;
    if (device != owner && d->cuDeviceCanAccessPeer(&can, device, owner) == CUDA_SUCCESS && can != 0)
      devices |= bit(device);
  }
  reachable_cache[owner].store(devices | known, std::memory_order_release);
  return devices;
}

CUresult context_device(CUcontext ctx, int& ordinal) {
  const driver_api* d = driver();
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  CUdevice device;
  CUresult e;
  if (d->cuCtxGetDevice_v2 != nullptr) {
    e = d->cuCtxGetDevice_v2(&device, ctx);
  } else {
    context_scope scope(*d, ctx);
    e = scope.active() ? d->cuCtxGetDevice(&device) : CUDA_ERROR_INVALID_CONTEXT;
  }
  if (e == CUDA_SUCCESS) ordinal = device;
  return e;
}

bool valid_device(int ordinal) { return ordinal >= 0 && ordinal < max_devices; }

// The devices whose pools hold the pointers, into `owners`; those of them whose pool some device that could
// reach it has no access to yet, returned.
std::uint32_t pools_lacking_peers(std::initializer_list<CUdeviceptr> pointers, std::uint32_t& owners) {
  std::uint32_t lacking = 0;
  for (const CUdeviceptr p : pointers) {
    const int owner = pool_device_containing(p);
    if (owner < 0 || (owners & bit(owner)) != 0) continue;
    owners |= bit(owner);
    if ((reachable_from(owner) & ~pool_peers(owner)) != 0) lacking |= bit(owner);
  }
  return lacking;
}

// The devices taking part in a copy: the pools' owners, the current context's device, the stream's, and the
// contexts' named.
std::uint32_t devices_taking_part(std::uint32_t owners, std::initializer_list<CUcontext> contexts, CUstream stream) {
  std::uint32_t taking_part = owners;
  int device = -1;
  if (current_device(device) == CUDA_SUCCESS && valid_device(device)) taking_part |= bit(device);
  if (stream != nullptr && stream_device(stream, device) == CUDA_SUCCESS && valid_device(device))
    taking_part |= bit(device);
  for (const CUcontext c : contexts)
    if (c != nullptr && context_device(c, device) == CUDA_SUCCESS && valid_device(device)) taking_part |= bit(device);
  return taking_part;
}

}  // namespace

void reach_for_copy(std::initializer_list<CUdeviceptr> pointers, std::initializer_list<CUcontext> contexts,
                    CUstream stream) noexcept {
  try {
    if (!shim_active()) return;
    std::uint32_t owners = 0;
    const std::uint32_t lacking = pools_lacking_peers(pointers, owners);
    if (lacking == 0) return;
    const std::uint32_t taking_part = devices_taking_part(owners, contexts, stream);
    for (int owner = 0; owner < max_devices; ++owner) {
      if ((lacking & bit(owner)) == 0) continue;
      const std::uint32_t wanted = taking_part & reachable_from(owner) & ~pool_peers(owner);
      for (int peer = 0; peer < max_devices; ++peer)
        if ((wanted & bit(peer)) != 0) (void)grant_pool_access(owner, peer);  // a failure is logged
    }
  } catch (...) {
    // Out of memory for a log line: the copy goes on and the driver answers it.
  }
}

}  // namespace vmmckpt::detail

using namespace vmmckpt;
using namespace vmmckpt::detail;

// The driver first: its answer is the program's (already enabled, unsupported, invalid context), and only
// access it granted is extended to the pool: the current context's device gets access to the pool of the
// peer context's device.
VMMCKPT_EXPORT CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuCtxEnablePeerAccess == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuCtxEnablePeerAccess(peer, flags);
    if (e != CUDA_SUCCESS || !shim_active()) return e;
    int here = -1, there = -1;
    if (current_device(here) != CUDA_SUCCESS || context_device(peer, there) != CUDA_SUCCESS) return e;
    gate_scope scope(gate_scope::no_work);  // not while a dump or suspend holds the pools
    (void)grant_pool_access(there, here);   // a failure is logged; the copy meets the driver's answer
    return e;
  });
}
