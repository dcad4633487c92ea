// Loads cuda-ckpt's CUDA driver with dlopen when first needed, so that the commands that touch no GPU run without one.
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/errors.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace vmmckpt::ckpt {
namespace {

struct loaded_driver {
  driver_api api;
  std::string error;  // empty when loaded
};

loaded_driver load() {
  loaded_driver d;
  const std::string library = driver_library_name();
  // Never closed: the table points into it until the tool exits.
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    d.error = "the CUDA driver (" + library + ") cannot be loaded: " + (why ? why : "unknown reason");
    return d;
  }
  std::string lacking;
  fill_driver_api(
      d.api, driver_user::tool, [&](const char* name) { return ::dlsym(handle, name); },
      [&](const char* name) { lacking += (lacking.empty() ? "" : ", ") + std::string(name); });
  if (!lacking.empty())
    d.error = "the CUDA driver (" + library + ") lacks " + lacking + ": it is older than cuda-ckpt needs (CUDA 12.0)";
  return d;
}

}  // namespace

std::string driver_library_name() {
  const char* chosen = std::getenv("VMMCKPT_LIBCUDA");
  return chosen != nullptr && *chosen != '\0' ? chosen : "libcuda.so.1";
}

const driver_api& driver() {
  static const loaded_driver loaded = load();
  if (!loaded.error.empty()) throw driver_unavailable(loaded.error);
  return loaded.api;
}

}  // namespace vmmckpt::ckpt
