// An image's bytes into device memory at their addresses, from several threads, checked as they pass.
#pragma once

#include <functional>

#include "vmmckpt/driver_api.hpp"
#include "vmmckpt/image.hpp"
#include "vmmckpt/status.hpp"

namespace vmmckpt::restore {

// Whether device memory [addr, addr + size) of `device` is mapped in this process: the gap between
// two allocations that is, is written along with them (zeroed), one copy for many allocations.
using backed_memory = std::function<bool(int device, std::uint64_t addr, std::uint64_t size)>;

// Bytes loaded so far of the total: at most ten times a second as extents complete, and once at the
// end; called by one uploading thread at a time (never concurrently), so it must be quick; what it
// throws is ignored.
using upload_progress = std::function<void(std::uint64_t done, std::uint64_t total)>;

// Fills every allocation's bytes from the image into device memory at its address (the allocations
// must be mapped already). The data files are read by several threads at once, each streaming
// through pinned buffers of its own into copies on its own stream; every extent's checksum is
// checked as its bytes pass. Allocations close together go in one copy where `backed` says the
// gaps between them are mapped (without it, each is copied alone). A failed status on the first
// failure (a bad checksum included): the device memory then holds an unknown mix and must not be
// used. The calling thread's context is kept. Without `vmm`, the pools of kind vmm are left out (a
// --replay restore writes them as the program maps them again).
status upload(const driver_api& d, const image::reader& reader, const backed_memory& backed = {},
              bool vmm = true, const upload_progress& progress = {}) noexcept;

}  // namespace vmmckpt::restore
