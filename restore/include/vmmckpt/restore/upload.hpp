// An image's bytes into device memory at their addresses, from several threads, checked as they pass.
#pragma once

#include "vmmckpt/driver_api.hpp"
#include "vmmckpt/image.hpp"
#include "vmmckpt/status.hpp"

namespace vmmckpt::restore {

// Fills every extent of the image into device memory at its address (the allocations must be
// mapped already). The data files are read by several threads at once, each streaming through
// pinned buffers of its own into copies on its own stream; every extent's checksum is checked
// as its bytes pass. A failed status on the first failure (a bad checksum included): the device
// memory then holds an unknown mix and must not be used. The calling thread's context is kept.
status upload(const driver_api& d, const image::reader& reader) noexcept;

}  // namespace vmmckpt::restore
