// Copies an image's bytes into the pools' device memory, from several threads, checking as it goes.
#pragma once

#include <string>

#include "real_symbols.hpp"
#include "vmmckpt/image.hpp"

namespace vmmckpt::detail {

// Fills every extent of the image into device memory at its address (the allocations must be
// mapped already). The data files are read by several threads at once, each streaming through
// pinned buffers of its own into copies on its own stream; every extent's checksum is checked
// as its bytes pass. False with `error` set on the first failure (a bad checksum included):
// the device memory then holds an unknown mix and must not be used.
bool load_image(const driver_api& d, const image::reader& reader, std::string& error);

}  // namespace vmmckpt::detail
