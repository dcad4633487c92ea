// The shim's one record of program-made VMM memory: the registry and the lock around it, shared by the VMM
// entry points (vmm_entry_points.cpp) and the checkpoint operations on that memory (vmm_checkpoint.cpp).
#pragma once

#include <cuda.h>

#include <array>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/pool/vmm_registry.hpp"
#include "vmmckpt/support/status.hpp"

namespace vmmckpt::detail {

static_assert(sizeof(CUmemAllocationProp) <= sizeof(vmm_properties::bytes), "the program's properties must fit");

struct vmm_state {
  std::mutex mutex;  // around the registry and the driver calls that change what it records
  vmm_config config;
  std::string config_error;
  vmm_registry registry;
  // Each device's window is one driver reservation, made whole the first time any reservation is placed
  // (exact_reservation.hpp says why): CUDA_SUCCESS once reserved, the error of a failed attempt (not
  // tried again), or CUDA_ERROR_NOT_INITIALIZED before the first attempt.
  std::array<CUresult, max_devices> windows;
  std::set<std::uint64_t> nccl_tokens;  // handles NCCL created (callers.hpp), for its share in `ps`

  explicit vmm_state(const vmm_config& c, std::string error)
      : config(c), config_error(std::move(error)), registry(c.base, c.window) {
    windows.fill(CUDA_ERROR_NOT_INITIALIZED);
  }
};

// Under the state's mutex: every device's window reserved from the driver, the first time (all at once, so
// that no range the driver places for itself meanwhile lands in a later one). Success when `device`'s
// window is reserved; a window that cannot be had is logged once, naming the range and VMMCKPT_VMM_BASE.
status reserve_windows(vmm_state& s, int device);

// Created by the first call that records something (the windows read from the environment then);
// never destroyed (threads may call at exit).
vmm_state& vmm_state_for_recording();
// The state when some VMM call already made it, else null: nothing was recorded yet.
vmm_state* existing_vmm_state();

// Live VMM memory of the program that the shim does not own (host locations, other properties,
// imported handles), by kind: what a suspend would leave on the GPU. Zero before any VMM call.
vmm_not_owned_bytes not_owned_vmm_bytes();
// Bytes of the owned handles NCCL created.
std::uint64_t nccl_vmm_bytes();

// Whether addr lies in a window of ours that the driver reserved whole; then `base` and `size` are the
// program's reservation around it, or 0 and 0 where it made none there. The driver would name the whole
// window (it knows only its own reservation); natively the program's reservation is the answer.
bool vmm_reservation_around(std::uint64_t addr, std::uint64_t& base, std::uint64_t& size);

// The program's CUmemAllocationProp of an owned handle, as it passed it.
inline CUmemAllocationProp program_properties(const vmm_handle& h) {
  CUmemAllocationProp prop;
  std::memcpy(&prop, h.properties.bytes.data(), sizeof prop);
  return prop;
}

inline bool is_host_location(CUmemLocationType t) {
  return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
         t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

// Memory on a host location (NCCL's host buffers): a suspend keeps it mapped, since it holds no GPU memory
// and the program's threads may touch it from the CPU meanwhile (NCCL's proxy polls it).
inline bool host_located(const vmm_handle& h) { return is_host_location(program_properties(h).location.type); }

}  // namespace vmmckpt::detail
