// The devices as the driver describes them.
#include "memory/devices.hpp"

#include "core/real_symbols.hpp"
#include "vmmckpt/support/uuid_text.hpp"

namespace vmmckpt::detail {

device_description describe_device(int ordinal) {
  device_description dev;
  dev.ordinal = ordinal;
  const driver_api* d = driver();
  CUdevice device;
  if (d == nullptr || d->cuDeviceGet(&device, ordinal) != CUDA_SUCCESS) return dev;
  char name[256] = {};
  if (d->cuDeviceGetName(name, sizeof name - 1, device) == CUDA_SUCCESS) dev.name = name;
  CUuuid uuid{};
  if (d->cuDeviceGetUuid_v2 != nullptr && d->cuDeviceGetUuid_v2(&uuid, device) == CUDA_SUCCESS)
    dev.uuid = uuid_text(uuid.bytes);
  d->cuDeviceGetAttribute(&dev.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  d->cuDeviceGetAttribute(&dev.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  return dev;
}

}  // namespace vmmckpt::detail
