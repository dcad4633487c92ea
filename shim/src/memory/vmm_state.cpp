// The shim's one record of program-made VMM memory: made by the first VMM call that records something, with
// the fork handlers that keep it consistent, and the windows it reserves from the driver (vmm_state.hpp).
#include <pthread.h>

#include <algorithm>
#include <atomic>

#include "core/first_use.hpp"
#include "core/real_symbols.hpp"
#include "memory/pools.hpp"
#include "vmmckpt/support/log.hpp"
#include "memory/vmm_state.hpp"
#include "vmmckpt/pool/exact_reservation.hpp"

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

}  // namespace

status reserve_windows(vmm_state& s, int device) {
  const driver_api* d = driver();
  if (d == nullptr) return status(CUDA_ERROR_NOT_INITIALIZED, "no CUDA driver");
  if (s.windows[0] == CUDA_ERROR_NOT_INITIALIZED) {
    int count = 0;
    if (d->cuDeviceGetCount == nullptr || d->cuDeviceGetCount(&count) != CUDA_SUCCESS || count <= 0) count = device + 1;
    count = std::min(std::max(count, device + 1), max_devices);
    for (int i = 0; i < max_devices; ++i) {
      if (i >= count) {
        s.windows[i] = CUDA_ERROR_INVALID_DEVICE;
        continue;
      }
      const std::uint64_t base = s.config.device_base(i);
      std::uint64_t moved_to = 0;
      s.windows[i] = reserve_exactly(*d, base, s.config.window, vmm_granularity, moved_to);
      if (s.windows[i] == CUDA_SUCCESS) continue;
      if (moved_to != 0)
        log::error("device {}'s VMM window [{:#x}, {:#x}) is taken in this process (the driver offered {:#x}); set "
                   "VMMCKPT_VMM_BASE to a free range. Every cuMemAddressReserve on device {} fails.",
                   i, base, base + s.config.window, moved_to, i);
      else
        log::error("reserving device {}'s VMM window [{:#x}, {:#x}) failed: error {}. Every cuMemAddressReserve on "
                   "device {} fails.",
                   i, base, base + s.config.window, static_cast<int>(s.windows[i]), i);
    }
  }
  if (device < 0 || device >= max_devices)
    return status(CUDA_ERROR_INVALID_DEVICE, "device " + std::to_string(device) + " is no device vmmckpt serves");
  if (s.windows[device] == CUDA_ERROR_INVALID_DEVICE) {
    // A device cuDeviceGetCount did not count (it can change with CUDA_VISIBLE_DEVICES only before cuInit).
    std::uint64_t moved_to = 0;
    s.windows[device] = reserve_exactly(*d, s.config.device_base(device), s.config.window, vmm_granularity, moved_to);
  }
  if (s.windows[device] == CUDA_SUCCESS) return {};
  // Logged when it was tried: the status only names it.
  return status(s.windows[device], "device " + std::to_string(device) + "'s VMM window is not reserved (CUDA error " +
                                       std::to_string(static_cast<int>(s.windows[device])) + ")");
}

vmm_state& vmm_state_for_recording() {
  static vmm_state* const created = [] {
    std::string pool_error, error;
    const pool_config pools = pool_config_from_env(pool_error);
    const vmm_config config = vmm_config_from_env(pools, error);
    auto* s = new vmm_state(config, error);
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    g_state.store(s, std::memory_order_release);
    // A program that maps all of its memory itself (a framework's own allocator) never reaches the pools:
    // its first VMM call makes it reachable by cuda-ckpt, as the first allocation does for others.
    note_served_memory();
    return s;
  }();
  return *created;
}

vmm_state* existing_vmm_state() { return g_state.load(std::memory_order_acquire); }

std::uint64_t nccl_vmm_bytes() {
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return 0;
  std::lock_guard lock(s->mutex);
  std::uint64_t bytes = 0;
  for (auto it = s->nccl_tokens.begin(); it != s->nccl_tokens.end();) {
    const vmm_handle* h = s->registry.find_handle(*it);
    if (h == nullptr) {
      it = s->nccl_tokens.erase(it);  // released since
      continue;
    }
    bytes += h->size;
    ++it;
  }
  return bytes;
}

vmm_not_owned_bytes not_owned_vmm_bytes() {
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return {};
  std::lock_guard lock(s->mutex);
  vmm_not_owned_bytes bytes = s->registry.not_owned_bytes();
  bytes.unmapped = s->registry.unmapped_handle_bytes();
  return bytes;
}

bool vmm_reservation_around(std::uint64_t addr, std::uint64_t& base, std::uint64_t& size) {
  vmm_state* s = existing_vmm_state();
  if (s == nullptr || !s->config_error.empty() || addr < s->config.base) return false;
  const std::uint64_t window = (addr - s->config.base) / s->config.window;
  if (window >= static_cast<std::uint64_t>(max_devices)) return false;
  std::lock_guard lock(s->mutex);
  if (s->windows[window] != CUDA_SUCCESS) return false;
  const std::optional<vmm_reservation> r = s->registry.reservation_at(addr);
  base = r ? r->addr : 0;
  size = r ? r->size : 0;
  return true;
}

}  // namespace vmmckpt::detail
