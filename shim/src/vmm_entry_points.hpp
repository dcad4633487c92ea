// What the VMM entry points tell the rest of the shim: the memory that passes through them.
#pragma once

#include "vmmckpt/pool/vmm_registry.hpp"

namespace vmmckpt::detail {

// Live VMM memory of the program that the shim does not own (host locations, other properties,
// imported handles), by kind: what a suspend would leave on the GPU. Zero before any VMM call.
vmm_not_owned_bytes not_owned_vmm_bytes();
// Bytes of the owned handles NCCL created.
std::uint64_t nccl_vmm_bytes();

// Whether addr lies in a window of ours that the driver reserved whole; then `base` and `size` are the
// program's reservation around it, or 0 and 0 where it made none there. The driver would name the whole
// window (it knows only its own reservation); natively the program's reservation is the answer.
bool vmm_reservation_around(std::uint64_t addr, std::uint64_t& base, std::uint64_t& size);

}  // namespace vmmckpt::detail
