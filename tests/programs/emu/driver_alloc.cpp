// Emulator test program: allocations through the driver API, with data written and read back.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "check.hpp"

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
  EXPECT(e == CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT(!held.empty());
  for (CUdeviceptr p : held) CHECK_CU(cuMemFree(p));
  CUdeviceptr again = 0;
  CHECK_CU(cuMemAlloc(&again, 256 << 20));
  EXPECT(again == held.front());
  print_ptr(again, 256 << 20, "cuMemAlloc");
  std::printf("done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CHECK_CU(cuInit(0));
  CUdevice dev;
  CHECK_CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  if (argc > 1 && std::strcmp(argv[1], "--exhaust") == 0) return exhaust();

  const size_t sizes[] = {1, 1000, 4096, 1 << 20, (2 << 20) + 3, 64 << 20, 300};
  std::vector<CUdeviceptr> ptrs;
  for (size_t size : sizes) {
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAlloc(&p, size));
    EXPECT(p % 256 == 0);
    print_ptr(p, size, "cuMemAlloc");
    ptrs.push_back(p);
    // Fill and read back: the memory must really be there, at that address.
    std::vector<unsigned char> out(size), in(size);
    for (size_t i = 0; i < size; ++i) out[i] = static_cast<unsigned char>(i * 7 + size);
    CHECK_CU(cuMemcpyHtoD(p, out.data(), size));
    CHECK_CU(cuMemcpyDtoH(in.data(), p, size));
    EXPECT(in == out);
  }

  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  CHECK_CU(cuMemAllocPitch(&pitched, &pitch, 1000, 10, 4));
  EXPECT(pitch >= 1000 && pitch % 256 == 0);
  print_ptr(pitched, pitch * 10, "cuMemAllocPitch");

  CUstream stream;
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr async_ptr = 0;
  CHECK_CU(cuMemAllocAsync(&async_ptr, 8192, stream));
  print_ptr(async_ptr, 8192, "cuMemAllocAsync");
  CHECK_CU(cuMemsetD32Async(async_ptr, 0xabcdef01u, 2048, stream));
  unsigned host[2048];
  CHECK_CU(cuMemcpyDtoHAsync(host, async_ptr, sizeof host, stream));
  CHECK_CU(cuStreamSynchronize(stream));
  for (unsigned v : host) EXPECT(v == 0xabcdef01u);
  CHECK_CU(cuMemFreeAsync(async_ptr, stream));
  CHECK_CU(cuStreamSynchronize(stream));

  // The allocation, not the physical handle under it, is what the range names.
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(cuMemGetAddressRange(&base, &size, ptrs[1] + 999));
  EXPECT(base == ptrs[1] && size == 1000);
  // So do the pointer's range attributes (the driver alone would name the pool's mapping).
  CUdeviceptr start = 0;
  size_t range = 0;
  CHECK_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptrs[1] + 999));
  CHECK_CU(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptrs[1] + 999));
  EXPECT(start == ptrs[1] && range == 1000);
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  unsigned memory_type = 0;
  start = 0;
  range = 0;
  void* answers[3] = {&start, &range, &memory_type};
  CHECK_CU(cuPointerGetAttributes(3, attrs, answers, ptrs[1] + 1));
  EXPECT(start == ptrs[1] && range == 1000 && memory_type == CU_MEMORYTYPE_DEVICE);

  size_t free_bytes = 0, total = 0;
  CHECK_CU(cuMemGetInfo(&free_bytes, &total));
  EXPECT(free_bytes <= total && total > 0);

  // Native answers for the edge cases.
  CUdeviceptr unused;
  EXPECT(cuMemAlloc(&unused, 0) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemAlloc(nullptr, 16) == CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree(ptrs[0]));
  EXPECT(cuMemFree(ptrs[0]) != CUDA_SUCCESS);  // double free
  EXPECT(cuMemFree(ptrs[2] + 256) != CUDA_SUCCESS);  // interior pointer

  // Reuse after free: same sequence, same address.
  CUdeviceptr again = 0;
  CHECK_CU(cuMemAlloc(&again, 1));
  print_ptr(again, 1, "cuMemAlloc");
  EXPECT(again == ptrs[0]);

  for (size_t i = 1; i < ptrs.size(); ++i) CHECK_CU(cuMemFree(ptrs[i]));
  CHECK_CU(cuMemFree(again));
  CHECK_CU(cuMemFree(pitched));
  CHECK_CU(cuStreamDestroy(stream));
  std::printf("done\n");
  return 0;
}
