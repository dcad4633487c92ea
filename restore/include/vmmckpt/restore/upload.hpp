// An image's bytes into device memory at their addresses, from several threads, checked as they pass.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "vmmckpt/support/driver_api.hpp"
#include "vmmckpt/support/host_pages.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/status.hpp"

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
// --replay restore writes them as the program maps them again). The bytes of `keep` (address order,
// disjoint) are read and checked but not written: memory that stayed in place and may have changed since
// (host memory a suspend kept mapped).
// `spare`: host memory set aside beforehand (load_buffer_bytes() of it) for the calling thread's buffers, used
// instead of new ones and kept: a suspended program reserves it when it takes the suspend, so that its resume
// does not fail for want of host memory (ulimit -v). Threads that cannot get buffers of their own then leave
// the work to the others.
using address_list = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
status upload(const driver_api& d, const image::reader& reader, const backed_memory& backed = {}, bool vmm = true,
              const upload_progress& progress = {}, const address_list& keep = {},
              host_pages* spare = nullptr) noexcept;

// The host memory one uploading thread's buffers take: what a suspend sets aside for its resume.
std::size_t load_buffer_bytes() noexcept;

}  // namespace vmmckpt::restore
