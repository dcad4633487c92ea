// What the VMM entry points tell the rest of the shim: the memory that passes through them.
#pragma once

#include "vmmckpt/vmm_registry.hpp"

namespace vmmckpt::detail {

// Live VMM memory of the program that the shim does not own (host locations, other properties,
// imported handles), by kind: what a suspend would leave on the GPU. Zero before any VMM call.
vmm_not_owned_bytes not_owned_vmm_bytes();

}  // namespace vmmckpt::detail
