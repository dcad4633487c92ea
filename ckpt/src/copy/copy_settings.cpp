// The defaults of copy_settings that depend on the machine.
#include "vmmckpt/ckpt/copy_settings.hpp"

#include <algorithm>
#include <thread>

namespace vmmckpt::ckpt {

int default_writers() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)); }

}  // namespace vmmckpt::ckpt
