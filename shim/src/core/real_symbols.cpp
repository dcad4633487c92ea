// Loads the real libcuda entry points and finds libcudart's, without linking either.
#include "core/real_symbols.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <string>

#include "vmmckpt/support/log.hpp"

// glibc's own dlsym, found by resolvers.cpp at load (or by the first dlsym(RTLD_NEXT, ...)).
extern "C" {
extern __attribute__((visibility("hidden"))) void* vmmckpt_glibc_dlsym;
__attribute__((visibility("hidden"))) void* vmmckpt_find_glibc_dlsym() noexcept;
}

namespace vmmckpt::detail {
namespace {

using dlsym_fn = void* (*)(void*, const char*);

struct loaded_driver {
  void* handle = nullptr;
  driver_api api;
  bool complete = false;
};

const loaded_driver& load_driver() noexcept {
  static const loaded_driver loaded = []() noexcept {
    loaded_driver d;
    d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d.handle == nullptr) {
      const char* why = dlerror();
      log::error("cannot load libcuda.so.1: {}", why ? why : "unknown reason");
      return d;
    }
    d.complete = true;
    fill_driver_api(
        d.api, driver_user::program, [&](const char* name) noexcept { return real_dlsym(d.handle, name); },
        [&](const char* name) noexcept {
          log::error("libcuda.so.1 has no {}: driver too old for vmmckpt", name);
          d.complete = false;
        });
    return d;
  }();
  return loaded;
}

// The path of the first loaded library whose file name starts with `prefix`.
struct library_search {
  const char* prefix;
  std::string path;
};
int find_library(dl_phdr_info* info, size_t, void* out) {
  auto* search = static_cast<library_search*>(out);
  const char* name = info->dlpi_name;
  if (name == nullptr) return 0;
  const char* base = std::strrchr(name, '/');
  base = base ? base + 1 : name;
  if (std::strncmp(base, search->prefix, std::strlen(search->prefix)) != 0) return 0;
  search->path = name;
  return 1;
}

}  // namespace

// Not instrumented by ASan: the dlsym we export is called by the ASan runtime itself before it has
// set up its shadow memory (scripts/sanitize.sh), and it lands here.
__attribute__((no_sanitize_address)) void* real_dlsym(void* handle, const char* name) noexcept {
  void* fn = __atomic_load_n(&vmmckpt_glibc_dlsym, __ATOMIC_ACQUIRE);
  if (fn == nullptr) fn = vmmckpt_find_glibc_dlsym();
  return fn ? reinterpret_cast<dlsym_fn>(fn)(handle, name) : nullptr;
}

const driver_api* driver() noexcept {
  const loaded_driver& d = load_driver();
  return d.complete ? &d.api : nullptr;
}

void* driver_library() noexcept { return load_driver().handle; }

void* library_symbol::resolve() noexcept {
  void* p = real_dlsym(RTLD_NEXT, name_);
  if (p == nullptr) {
    try {
      library_search search{library_, {}};
      dl_iterate_phdr(find_library, &search);
      const std::string& path = search.path;
      if (!path.empty()) {
        // RTLD_NOLOAD: only a library the program already has; never load one.
        if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
          p = real_dlsym(handle, name_);
          dlclose(handle);
        }
      }
    } catch (...) {
      return nullptr;  // no memory for the path: not found this time
    }
  }
  if (p != nullptr) address_.store(p, std::memory_order_release);
  return p;
}

}  // namespace vmmckpt::detail
