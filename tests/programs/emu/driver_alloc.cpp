// Emulator test program: allocations through the driver API, with data written and read back.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

using vmmckpt::contracts::print_ptr;

namespace {

// Past the device's memory: a clean error, no crash, and the pool usable again after frees.
int exhaust() {
  std::vector<CUdeviceptr> held;
  CUresult e = CUDA_SUCCESS;
  for (int i = 0; i < 100000 && e == CUDA_SUCCESS; ++i) {
    CUdeviceptr p = 0;
    e = cuMemAlloc(&p, 256 << 20);
    if (e == CUDA_SUCCESS) held.push_back(p);
  }
  const char* name = nullptr;
  cuGetErrorName(e, &name);
  std::printf("exhausted after %zu blocks: %s\n", held.size(), name ? name : "?");
  VMMCKPT_EXPECT(e == CUDA_ERROR_OUT_OF_MEMORY);
  VMMCKPT_EXPECT(!held.empty());
  for (CUdeviceptr p : held) VMMCKPT_CHECK(cuMemFree(p));
  CUdeviceptr again = 0;
  VMMCKPT_CHECK(cuMemAlloc(&again, 256 << 20));
  VMMCKPT_EXPECT(again == held.front());
  print_ptr(again, 256 << 20, "cuMemAlloc");
  std::printf("done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  VMMCKPT_CHECK(cuInit(0));
  CUdevice dev;
  VMMCKPT_CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  if (argc > 1 && std::strcmp(argv[1], "--exhaust") == 0) return exhaust();

  const size_t sizes[] = {1, 1000, 4096, 1 << 20, (2 << 20) + 3, 64 << 20, 300};
  std::vector<CUdeviceptr> ptrs;
  for (size_t size : sizes) {
    CUdeviceptr p = 0;
    VMMCKPT_CHECK(cuMemAlloc(&p, size));
    VMMCKPT_EXPECT(p % 256 == 0);
    print_ptr(p, size, "cuMemAlloc");
    ptrs.push_back(p);
    // Fill and read back: the memory must really be there, at that address.
    std::vector<unsigned char> out(size), in(size);
    for (size_t i = 0; i < size; ++i) out[i] = static_cast<unsigned char>(i * 7 + size);
    VMMCKPT_CHECK(cuMemcpyHtoD(p, out.data(), size));
    VMMCKPT_CHECK(cuMemcpyDtoH(in.data(), p, size));
    VMMCKPT_EXPECT(in == out);
  }

  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  VMMCKPT_CHECK(cuMemAllocPitch(&pitched, &pitch, 1000, 10, 4));
  VMMCKPT_EXPECT(pitch >= 1000 && pitch % 256 == 0);
  print_ptr(pitched, pitch * 10, "cuMemAllocPitch");

  CUstream stream;
  VMMCKPT_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr async_ptr = 0;
  VMMCKPT_CHECK(cuMemAllocAsync(&async_ptr, 8192, stream));
  print_ptr(async_ptr, 8192, "cuMemAllocAsync");
  VMMCKPT_CHECK(cuMemsetD32Async(async_ptr, 0xabcdef01u, 2048, stream));
  unsigned host[2048];
  VMMCKPT_CHECK(cuMemcpyDtoHAsync(host, async_ptr, sizeof host, stream));
  VMMCKPT_CHECK(cuStreamSynchronize(stream));
  for (unsigned v : host) VMMCKPT_EXPECT(v == 0xabcdef01u);
  VMMCKPT_CHECK(cuMemFreeAsync(async_ptr, stream));
  VMMCKPT_CHECK(cuStreamSynchronize(stream));

  // The allocation, not the physical handle under it, is what the range names.
  CUdeviceptr base = 0;
  size_t size = 0;
  VMMCKPT_CHECK(cuMemGetAddressRange(&base, &size, ptrs[1] + 999));
  VMMCKPT_EXPECT(base == ptrs[1] && size == 1000);
  // So do the pointer's range attributes (the driver alone would name the pool's mapping).
  CUdeviceptr start = 0;
  size_t range = 0;
  VMMCKPT_CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptrs[1] + 999));
  VMMCKPT_CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptrs[1] + 999));
  VMMCKPT_EXPECT(start == ptrs[1] && range == 1000);
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  unsigned memory_type = 0;
  start = 0;
  range = 0;
  void* answers[3] = {&start, &range, &memory_type};
  VMMCKPT_CHECK(cuPointerGetAttributes(3, attrs, answers, ptrs[1] + 1));
  VMMCKPT_EXPECT(start == ptrs[1] && range == 1000 && memory_type == CU_MEMORYTYPE_DEVICE);

  size_t free_bytes = 0, total = 0;
  VMMCKPT_CHECK(cuMemGetInfo(&free_bytes, &total));
  VMMCKPT_EXPECT(free_bytes <= total && total > 0);

  // Native answers for the edge cases.
  CUdeviceptr unused;
  VMMCKPT_EXPECT(cuMemAlloc(&unused, 0) == CUDA_ERROR_INVALID_VALUE);
  VMMCKPT_EXPECT(cuMemAlloc(nullptr, 16) == CUDA_ERROR_INVALID_VALUE);
  VMMCKPT_CHECK(cuMemFree(ptrs[0]));
  VMMCKPT_EXPECT(cuMemFree(ptrs[0]) != CUDA_SUCCESS);        // double free
  VMMCKPT_EXPECT(cuMemFree(ptrs[2] + 256) != CUDA_SUCCESS);  // interior pointer

  // Reuse after free: same sequence, same address.
  CUdeviceptr again = 0;
  VMMCKPT_CHECK(cuMemAlloc(&again, 1));
  print_ptr(again, 1, "cuMemAlloc");
  VMMCKPT_EXPECT(again == ptrs[0]);

  for (size_t i = 1; i < ptrs.size(); ++i) VMMCKPT_CHECK(cuMemFree(ptrs[i]));
  VMMCKPT_CHECK(cuMemFree(again));
  VMMCKPT_CHECK(cuMemFree(pitched));
  VMMCKPT_CHECK(cuStreamDestroy(stream));
  std::printf("done\n");
  return 0;
}
