// An image's allocations back in a process's pools: placed at their addresses at the start of a restored
// process, or backed again under a suspended process's live blocks. The bytes are upload.hpp's.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "vmmckpt/pool/device_pool.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/restore/handoff.hpp"
#include "vmmckpt/support/status.hpp"

namespace vmmckpt::restore {

// The pool of a device ordinal in this process, created on first use (the shim's acquire_pool).
using pool_for_device = std::function<status(int ordinal, device_pool*& pool)>;
// The pool that starts at base in this process, or null.
using pool_at_base = std::function<device_pool*(std::uint64_t base)>;

// A new process: every pool of the image at its address (the process's pool layout must be the
// image's), every allocation placed there: live, or with `replay` only its memory. Fails naming
// the allocation that cannot be placed, or the pool that is not where the image's was.
status place_allocations(const image::manifest& m, mode how, const pool_for_device& pool_for) noexcept;

// Resume: physical memory again under every live block of each pool the image names, which must
// hold exactly the image's allocations. On failure whatever was created is given back (the
// pools stay without physical memory) and the status says why.
status back_suspended_pools(const image::manifest& m, const pool_at_base& pool_at,
                            std::vector<device_pool*>& backed) noexcept;

// Gives back the physical memory of pools back_suspended_pools() backed (a resume that failed later).
void release_pools(const std::vector<device_pool*>& pools) noexcept;

}  // namespace vmmckpt::restore
