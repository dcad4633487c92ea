// The tool's side of restoring into a new process: the checks and the plan, handed to the shim through the
// environment (handoff.hpp). The restoring process checks every extent again as it loads: the image may change
// in between.
#include "vmmckpt/restore/tool/new_process.hpp"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/restore/restore_plan.hpp"

namespace vmmckpt::restore {

new_process_start prepare_new_process(const new_process_options& o) {
  const auto reader = image::reader::open(o.image);
  if (o.verify_data)
    reader.verify_data();
  else
    reader.verify_manifest();
  const auto plan = plan_restore(reader.info(), o.image.string(), o.device >= 0);
  if (o.device >= 0) {
    const driver_api& d = ckpt::driver();
    if (d.cuInit(0) != CUDA_SUCCESS) throw image::image_error("--device: the CUDA driver finds no GPU here");
    int count = 0;
    d.cuDeviceGetCount(&count);
    const std::string visible = visible_devices_for(plan.device, o.device, count, std::getenv("CUDA_VISIBLE_DEVICES"));
    ::setenv("CUDA_VISIBLE_DEVICES", visible.c_str(), 1);
  }
  new_process_start start;
  start.manifest = reader.info();
  handoff& h = start.how;
  h.image = std::filesystem::absolute(o.image).string();
  h.how = o.replay ? mode::replay : mode::live;
  h.pid = ::getpid();
  h.pool_base = plan.pool_base;
  h.pool_size = plan.pool_size;
  h.vmm_base = plan.vmm_base;
  h.vmm_window = plan.vmm_window;
  return start;
}

}  // namespace vmmckpt::restore
