// What restoring an image into a new process needs, checked before anything starts: the pool layout, and `--device`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "vmmckpt/image/image.hpp"

namespace vmmckpt::restore {

struct restore_plan {
  // Device 0's pool base and each device's pool size of the layout the image's pools follow; 0 when the
  // image has no pool (the process then keeps its own VMMCKPT_POOL_BASE and VMMCKPT_POOL_SIZE).
  std::uint64_t pool_base = 0;
  std::uint64_t pool_size = 0;
  int device = 0;  // the device of the first pool (the only one, for --device)
  // The VMM windows the program's own VMM memory lay in (VMMCKPT_VMM_BASE, VMMCKPT_VMM_WINDOW); 0 when the
  // image has none (the process then keeps its own).
  std::uint64_t vmm_base = 0;
  std::uint64_t vmm_window = 0;
};

// The pool layout and VMM windows the new process must use so that every pool and VMM reservation lands
// where the image's was (an image that opened follows one: image::validate). An image_error naming the
// image when it holds no memory at all, or when `moving` (--device) and it has memory on more than one
// device.
restore_plan plan_restore(const image::manifest& m, const std::string& image_name, bool moving);

// --device: the CUDA_VISIBLE_DEVICES that makes this machine's GPU `target` (an ordinal as the
// caller sees devices, `device_count` of them, under `visible`, the current CUDA_VISIBLE_DEVICES
// or null) appear to the program as its device `ordinal`. The two trade places, so every other
// device keeps its ordinal too. An image_error when either is out of range.
std::string visible_devices_for(int ordinal, int target, int device_count, const char* visible);

}  // namespace vmmckpt::restore
