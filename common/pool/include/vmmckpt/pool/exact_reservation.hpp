// One driver reservation at exactly the address asked for, or a refusal: how the shim places its pools and
// VMM windows and how cuda-ckpt maps a held program's memory, since addresses elsewhere could never be
// restored.
//
// The driver honours the hint of a large reservation whose range is free, moves one whose range is taken
// and still answers success, and places a small one (under 32 MiB, measured on an H200 with driver 580) in
// ranges of its own whatever the hint. So a range of ours is always reserved whole and large (a pool, a
// device's VMM window), and the program's small reservations are carved out of it (docs/vmm.md).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "vmmckpt/support/driver_api.hpp"

namespace vmmckpt {

// CUDA_SUCCESS with [base, base + size) reserved; otherwise nothing stays reserved, and `moved_to` is the
// address the driver offered instead (0 when it refused outright, with its error returned). A range the
// driver moved comes back as CUDA_ERROR_OUT_OF_MEMORY: it is taken in this process.
inline CUresult reserve_exactly(const driver_api& d, std::uint64_t base, std::uint64_t size, std::uint64_t alignment,
                                std::uint64_t& moved_to) {
  moved_to = 0;
  CUdeviceptr got = 0;
  const CUresult e = d.cuMemAddressReserve(&got, size, alignment, base, 0);
  if (e != CUDA_SUCCESS) return e;
  if (got == base) return CUDA_SUCCESS;
  d.cuMemAddressFree(got, size);
  moved_to = got;
  return CUDA_ERROR_OUT_OF_MEMORY;
}

}  // namespace vmmckpt
