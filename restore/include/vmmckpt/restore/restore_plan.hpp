// What restoring an image into a new process needs, checked before anything starts: the pool layout, and `--device`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "vmmckpt/image.hpp"
#include "vmmckpt/pool_layout.hpp"

namespace vmmckpt::restore {

struct restore_plan {
  std::uint64_t pool_base = default_pool_base;  // device 0's pool base of the layout the image's pools follow
  std::uint64_t pool_size = default_pool_size;  // each device's pool size
  int device = 0;               // the device of the first pool (the only one, for --device)
  // The VMM windows the program's own VMM memory lay in (VMMCKPT_VMM_BASE, VMMCKPT_VMM_WINDOW); the
  // defaults when the image has none.
  std::uint64_t vmm_base = default_vmm_base;
  std::uint64_t vmm_window = default_vmm_window;
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
