// Loads the real libcuda entry points and finds libcudart's, without linking either.
#include "real_symbols.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <mutex>
#include <string>

#include "log.hpp"

namespace vmmckpt::detail {
namespace {

using dlsym_fn = void* (*)(void*, const char*);

// Not instrumented by ASan: the dlsym we export is called by the ASan runtime itself before it has
// set up its shadow memory (scripts/sanitize.sh), and it lands here.
__attribute__((no_sanitize_address)) dlsym_fn glibc_dlsym() {
  static const dlsym_fn fn = []() __attribute__((no_sanitize_address)) {
    // The versioned lookup reaches glibc's dlsym even though the shim exports one.
    void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");  // arm64
    return reinterpret_cast<dlsym_fn>(p);
  }();
  return fn;
}

const driver_api* load_driver() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    log::error("cannot load libcuda.so.1: {}", why ? why : "unknown reason");
    return nullptr;
  }
  static driver_api api;
  bool complete = true;
#define VMMCKPT_LOAD(name)                                                                 \
  api.name = reinterpret_cast<decltype(api.name)>(real_dlsym(handle, #name));             \
  if (api.name == nullptr) {                                                              \
    log::error("libcuda.so.1 has no {}: driver too old for vmmckpt", #name);              \
    complete = false;                                                                     \
  }
  VMMCKPT_DRIVER_FUNCTIONS(VMMCKPT_LOAD)
#undef VMMCKPT_LOAD
#define VMMCKPT_LOAD_OPTIONAL(name) api.name = reinterpret_cast<decltype(api.name)>(real_dlsym(handle, #name));
  VMMCKPT_OPTIONAL_DRIVER_FUNCTIONS(VMMCKPT_LOAD_OPTIONAL)
#undef VMMCKPT_LOAD_OPTIONAL
  api.cuGetProcAddress_v1 = reinterpret_cast<get_proc_address_v1_fn>(real_dlsym(handle, "cuGetProcAddress"));
  return complete ? &api : nullptr;
}

int find_cudart(dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (name == nullptr) return 0;
  const char* base = std::strrchr(name, '/');
  base = base ? base + 1 : name;
  if (std::strncmp(base, "libcudart.so", 12) != 0) return 0;
  *static_cast<std::string*>(out) = name;
  return 1;
}

}  // namespace

__attribute__((no_sanitize_address)) void* real_dlsym(void* handle, const char* name) {
  const dlsym_fn fn = glibc_dlsym();
  return fn ? fn(handle, name) : nullptr;
}

const driver_api* driver() {
  static const driver_api* api = load_driver();
  return api;
}

void* runtime_symbol::resolve() {
  void* p = real_dlsym(RTLD_NEXT, name_);
  if (p == nullptr) {
    std::string path;
    dl_iterate_phdr(find_cudart, &path);
    if (!path.empty()) {
      // RTLD_NOLOAD: only a libcudart the program already has; never load one.
      if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
        p = real_dlsym(handle, name_);
        dlclose(handle);
      }
    }
  }
  if (p != nullptr) address_.store(p, std::memory_order_release);
  return p;
}

}  // namespace vmmckpt::detail
