// Emulator test program: the shim's entry points called while every C++ allocation fails return an error
// code, never an exception or a termination, and work again once memory is back.
//
// Replacing operator new here replaces it for the shim too (it reaches libstdc++'s through the
// dynamic linker). Run with VMMCKPT_LOG_LEVEL=trace so that every entry point formats log lines.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <new>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

using vmmckpt::contracts::print_ptr;

namespace {
thread_local bool fail_allocations = false;
}  // namespace

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (fail_allocations) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

int main() {
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));

  // (The first allocation creates the pool: with memory, since the emulated driver's own reservation
  // would fail without it, and a pool that cannot be reserved stays refused.)
  CUdeviceptr p = 0;
  VMMCKPT_CHECK(cuMemAlloc(&p, 1 << 20));
  print_ptr(p, 1 << 20, "cuMemAlloc");
  CUdeviceptr q = 0;
  VMMCKPT_CHECK(cuMemAlloc(&q, 5 << 20));

  // Every door and kind of entry point, while allocations fail: a code or success, never a throw.
  fail_allocations = true;
  CUdeviceptr r = 0;
  const CUresult again = cuMemAlloc(&r, 3 << 20);
  const CUresult set = cuMemsetD8(p, 7, 1 << 20);  // a gated entry point
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void* found = lib != nullptr ? dlsym(lib, "cuMemAlloc_v2") : nullptr;
  void* proc = nullptr;
  CUdriverProcAddressQueryResult status{};
  const CUresult resolved = cuGetProcAddress("cuMemAlloc", &proc, 13000, 0, &status);
  const CUresult freed = cuMemFree(q);
  fail_allocations = false;
  std::printf("without memory: alloc %d, memset %d, dlsym %s, cuGetProcAddress %d, free %d\n", static_cast<int>(again),
              static_cast<int>(set), found != nullptr ? "found" : "null", static_cast<int>(resolved),
              static_cast<int>(freed));
  if (again == CUDA_SUCCESS) VMMCKPT_CHECK(cuMemFree(r));
  if (freed != CUDA_SUCCESS) VMMCKPT_CHECK(cuMemFree(q));

  // Memory is back: everything works as before.
  VMMCKPT_CHECK(cuMemsetD8(p, 9, 1 << 20));
  unsigned char byte = 0;
  VMMCKPT_CHECK(cuMemcpyDtoH(&byte, p + 100, 1));
  VMMCKPT_EXPECT(byte == 9);
  VMMCKPT_CHECK(cuMemFree(p));
  std::printf("survived\n");
  return 0;
}
