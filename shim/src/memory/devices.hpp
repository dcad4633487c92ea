// The devices as hello, dumps and exported handles describe them (what the driver says of each).
#pragma once

#include "vmmckpt/support/device_description.hpp"

namespace vmmckpt::detail {

// Device `ordinal`: its name, UUID and compute capability; only the ordinal when the driver cannot say.
device_description describe_device(int ordinal);

}  // namespace vmmckpt::detail
