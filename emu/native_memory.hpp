// Native (cuMemAlloc-style) device allocations, shared by the synchronous and stream-ordered APIs.
#pragma once

#include "emu_api.hpp"

#include <cstddef>
#include <cstdint>

namespace vmmckpt::emu {

// An anonymous mapping charged to `device`; CUDA_ERROR_OUT_OF_MEMORY past VMMCKPT_EMU_MEM.
CUresult allocate_native(int device, std::size_t bytes, std::uintptr_t& out);
// Frees a native allocation that starts at `p`, without waiting for any stream (callers decide).
CUresult release_native(std::uintptr_t p);

}  // namespace vmmckpt::emu
