// Emulator test program: allocations through entry points found by dlsym and cuGetProcAddress, as static cudart does.
#include <cuda.h>
#include <dlfcn.h>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

using vmmckpt::contracts::print_ptr;

using alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
using free_fn = CUresult (*)(CUdeviceptr);
using get_proc_fn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using init_fn = CUresult (*)(unsigned);
using ctx_retain_fn = CUresult (*)(CUcontext*, CUdevice);
using ctx_set_fn = CUresult (*)(CUcontext);

int main() {
  // No link-time libcuda at all: everything through the loader, like cudart.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  VMMCKPT_EXPECT(lib != nullptr);
  auto get_proc = reinterpret_cast<get_proc_fn>(dlsym(lib, "cuGetProcAddress_v2"));
  VMMCKPT_EXPECT(get_proc != nullptr);

  void* p = nullptr;
  CUdriverProcAddressQueryResult status;
  VMMCKPT_EXPECT(get_proc("cuInit", &p, 13000, 0, &status) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(reinterpret_cast<init_fn>(p)(0) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(get_proc("cuDevicePrimaryCtxRetain", &p, 13000, 0, &status) == CUDA_SUCCESS);
  CUcontext ctx;
  VMMCKPT_EXPECT(reinterpret_cast<ctx_retain_fn>(p)(&ctx, 0) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(get_proc("cuCtxSetCurrent", &p, 13000, 0, &status) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(reinterpret_cast<ctx_set_fn>(p)(ctx) == CUDA_SUCCESS);

  // Through cuGetProcAddress, by base name and version.
  void* alloc_p = nullptr;
  void* free_p = nullptr;
  VMMCKPT_EXPECT(get_proc("cuMemAlloc", &alloc_p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(get_proc("cuMemFree", &free_p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS);
  CUdeviceptr a = 0, b = 0, c = 0;
  VMMCKPT_EXPECT(reinterpret_cast<alloc_fn>(alloc_p)(&a, 5000) == CUDA_SUCCESS);
  print_ptr(a, 5000, "cuGetProcAddress:cuMemAlloc");

  // Through dlsym of the exact exported name.
  auto alloc_sym = reinterpret_cast<alloc_fn>(dlsym(lib, "cuMemAlloc_v2"));
  VMMCKPT_EXPECT(alloc_sym != nullptr);
  VMMCKPT_EXPECT(alloc_sym(&b, 3 << 20) == CUDA_SUCCESS);
  print_ptr(b, 3 << 20, "dlsym:cuMemAlloc_v2");

  // cuGetProcAddress itself found through cuGetProcAddress must still be ours.
  void* inner = nullptr;
  VMMCKPT_EXPECT(get_proc("cuGetProcAddress", &inner, 13000, 0, &status) == CUDA_SUCCESS);
  void* alloc_again = nullptr;
  VMMCKPT_EXPECT(reinterpret_cast<get_proc_fn>(inner)("cuMemAlloc", &alloc_again, 13000, 0, &status) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(reinterpret_cast<alloc_fn>(alloc_again)(&c, 100) == CUDA_SUCCESS);
  print_ptr(c, 100, "cuGetProcAddress(cuGetProcAddress):cuMemAlloc");

  // An unknown name still answers as the driver does: no function, status "not found"
  // (driver 580 returns CUDA_SUCCESS with that status, so the status is what counts).
  void* nothing = reinterpret_cast<void*>(1);
  const CUresult unknown = get_proc("cuNoSuchFunction", &nothing, 13000, 0, &status);
  std::printf("info unknown-symbol result %d status %d\n", static_cast<int>(unknown), static_cast<int>(status));
  VMMCKPT_EXPECT(nothing == nullptr);
  VMMCKPT_EXPECT(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

  auto free_fn_ptr = reinterpret_cast<free_fn>(free_p);
  VMMCKPT_EXPECT(free_fn_ptr(a) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(free_fn_ptr(b) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(free_fn_ptr(c) == CUDA_SUCCESS);
  std::printf("done\n");
  return 0;
}
