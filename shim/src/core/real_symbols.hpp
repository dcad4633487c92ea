// The real driver and runtime entry points, found at run time: the shim links neither libcuda nor libcudart.
#pragma once

#include <atomic>

#include "vmmckpt/support/driver_api.hpp"

namespace vmmckpt::detail {

// The real driver, loaded on first use. Null when libcuda.so.1 cannot be
// loaded or lacks a required entry point (logged once).
const driver_api* driver() noexcept;
// The dlopen handle of that libcuda.so.1, for looking up entry points the table does not list;
// null when it could not be loaded.
void* driver_library() noexcept;

// glibc's dlsym, bypassing the shim's own.
void* real_dlsym(void* handle, const char* name) noexcept;

// A function of a library the program loads itself (libcudart, libnccl), looked up when first needed: it may
// be loaded after the shim, and privately (RTLD_LOCAL, as Python extensions are), where RTLD_NEXT does not see
// it. `library` is the start of its file name ("libcudart.so").
class library_symbol {
 public:
  constexpr library_symbol(const char* name, const char* library) : name_(name), library_(library) {}
  template <typename Fn>
  Fn get() noexcept {
    void* p = address_.load(std::memory_order_acquire);
    if (p == nullptr) p = resolve();
    return reinterpret_cast<Fn>(p);
  }

 private:
  void* resolve() noexcept;
  const char* name_;
  const char* library_;
  std::atomic<void*> address_{nullptr};
};

// A runtime API function (libcudart).
struct runtime_symbol : library_symbol {
  explicit constexpr runtime_symbol(const char* name) : library_symbol(name, "libcudart.so") {}
};

// An NCCL function (libnccl.so.2, which PyTorch's wheels load privately).
struct nccl_symbol : library_symbol {
  explicit constexpr nccl_symbol(const char* name) : library_symbol(name, "libnccl.so") {}
};

}  // namespace vmmckpt::detail
