// What restoring an image into a new process needs, checked before anything starts: the pool layout, and `--device`.
#include "vmmckpt/restore/restore_plan.hpp"

#include <vector>

namespace vmmckpt::restore {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

restore_plan plan_restore(const image::manifest& m, const std::string& image_name, bool moving) {
  if (m.pools.empty()) throw image::image_error(image_name + ": the image holds no GPU memory");
  restore_plan plan;
  const image::pool* first = nullptr;  // of kind pool
  for (const image::pool& p : m.pools)
    if (p.kind == image::pool_kind::pool && first == nullptr) first = &p;
  if (first != nullptr) {
    plan.pool_base = first->base - static_cast<std::uint64_t>(first->device) * first->size;
    plan.pool_size = first->size;
  }
  plan.device = (first != nullptr ? *first : m.pools.front()).device;
  if (m.vmm) {
    plan.vmm_base = m.vmm->windows.base;
    plan.vmm_window = m.vmm->windows.window;
  }
  // That the pools follow one layout a process can use is a rule of every image (image::validate).
  if (moving)
    for (const image::pool& p : m.pools)
      if (p.device != plan.device)
        throw image::image_error(image_name +
                                 ": --device moves single-device images only (this one has memory on "
                                 "devices " +
                                 std::to_string(plan.device) + " and " + std::to_string(p.device) + ")");
  return plan;
}

std::string visible_devices_for(int ordinal, int target, int device_count, const char* visible) {
  if (target < 0 || target >= device_count)
    throw image::image_error("--device " + std::to_string(target) + ": this machine has " +
                             std::to_string(device_count) + " GPU(s)");
  if (ordinal < 0 || ordinal >= device_count)
    throw image::image_error("the image's program used device " + std::to_string(ordinal) + "; this machine has " +
                             std::to_string(device_count) + " GPU(s)");
  std::vector<std::string> devices;
  if (visible != nullptr && *visible != '\0') devices = split(visible);
  devices.resize(static_cast<std::size_t>(device_count));
  for (int i = 0; i < device_count; ++i)
    if (devices[static_cast<std::size_t>(i)].empty()) devices[static_cast<std::size_t>(i)] = std::to_string(i);
  std::swap(devices[static_cast<std::size_t>(ordinal)], devices[static_cast<std::size_t>(target)]);
  std::string joined;
  for (const auto& d : devices) joined += (joined.empty() ? "" : ",") + d;
  return joined;
}

}  // namespace vmmckpt::restore
