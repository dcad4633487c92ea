// The shim's one record of program-made VMM memory: the registry and the lock around it, shared by the VMM
// entry points (vmm_entry_points.cpp) and the checkpoint operations on that memory (vmm_checkpoint.cpp).
#pragma once

#include <cuda.h>

#include <cstring>
#include <mutex>
#include <string>

#include "vmmckpt/pool_layout.hpp"
#include "vmmckpt/vmm_registry.hpp"

namespace vmmckpt::detail {

static_assert(sizeof(CUmemAllocationProp) <= sizeof(vmm_properties::bytes), "the program's properties must fit");

struct vmm_state {
  std::mutex mutex;  // around the registry and the driver calls that change what it records
  vmm_config config;
  std::string config_error;
  vmm_registry registry;

  explicit vmm_state(const vmm_config& c, std::string error)
      : config(c), config_error(std::move(error)), registry(c.base, c.window) {}
};

// Created by the first call that records something (the windows read from the environment then);
// never destroyed (threads may call at exit).
vmm_state& vmm_state_for_recording();
// The state when some VMM call already made it, else null: nothing was recorded yet.
vmm_state* existing_vmm_state();

// The program's CUmemAllocationProp of an owned handle, as it passed it.
inline CUmemAllocationProp program_properties(const vmm_handle& h) {
  CUmemAllocationProp prop;
  std::memcpy(&prop, h.properties.bytes.data(), sizeof prop);
  return prop;
}

}  // namespace vmmckpt::detail
