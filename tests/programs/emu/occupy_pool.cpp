// Emulator test program: the pool's address range is already taken when CUDA starts.
#include <cuda.h>
#include <sys/mman.h>

#include <cstdlib>

#include "support/cuda_check.hpp"

int main() {
  // Take 2 MiB at the start of device 0's pool before the shim can reserve it.
  const char* base_text = std::getenv("VMMCKPT_POOL_BASE");
  const unsigned long long base = base_text ? std::strtoull(base_text, nullptr, 0) : 0x200000000000ULL;
  void* taken = mmap(reinterpret_cast<void*>(base), 2 << 20, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  VMMCKPT_EXPECT(taken == reinterpret_cast<void*>(base));

  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr p = 0;
  const CUresult first = cuMemAlloc(&p, 4096);
  const CUresult second = cuMemAlloc(&p, 4096);
  const char* name = nullptr;
  cuGetErrorName(first, &name);
  std::printf("result %s\n", name ? name : "?");
  // Refused, consistently, and never placed somewhere that cannot be restored.
  VMMCKPT_EXPECT(first == CUDA_ERROR_OUT_OF_MEMORY && second == CUDA_ERROR_OUT_OF_MEMORY);
  std::printf("done\n");
  return 0;
}
