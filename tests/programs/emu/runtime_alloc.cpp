// Emulator test program: allocations through the runtime API (linked shared or static cudart).
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "check.hpp"

int main(int argc, char** argv) {
  const bool exhaust = argc > 1 && std::strcmp(argv[1], "--exhaust") == 0;
  int count = 0;
  CHECK_RT(cudaGetDeviceCount(&count));
  EXPECT(count >= 1);
  CHECK_RT(cudaSetDevice(0));

  if (exhaust) {
    // Past the device's memory: a clean error, the runtime's last error set, no crash.
    std::vector<void*> held;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 1000 && e == cudaSuccess; ++i) {
      void* p = nullptr;
      e = cudaMalloc(&p, 256 << 20);
      if (e == cudaSuccess) held.push_back(p);
    }
    std::printf("exhausted after %zu blocks: %s\n", held.size(), cudaGetErrorName(e));
    EXPECT(e == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaSuccess);
    for (void* p : held) CHECK_RT(cudaFree(p));
    void* again = nullptr;
    CHECK_RT(cudaMalloc(&again, 256 << 20));  // usable again after frees
    print_ptr(reinterpret_cast<unsigned long long>(again), 256 << 20, "cudaMalloc");
    std::printf("done\n");
    return 0;
  }

  const size_t sizes[] = {256, 10000, 1 << 20, 3 << 20, 32 << 20};
  std::vector<void*> ptrs;
  for (size_t size : sizes) {
    void* p = nullptr;
    CHECK_RT(cudaMalloc(&p, size));
    EXPECT(reinterpret_cast<uintptr_t>(p) % 256 == 0);
    print_ptr(reinterpret_cast<unsigned long long>(p), size, "cudaMalloc");
    std::vector<unsigned char> out(size), in(size);
    for (size_t i = 0; i < size; ++i) out[i] = static_cast<unsigned char>(i ^ size);
    CHECK_RT(cudaMemcpy(p, out.data(), size, cudaMemcpyHostToDevice));
    CHECK_RT(cudaMemcpy(in.data(), p, size, cudaMemcpyDeviceToHost));
    EXPECT(in == out);
    ptrs.push_back(p);
  }

  void* pitched = nullptr;
  size_t pitch = 0;
  CHECK_RT(cudaMallocPitch(&pitched, &pitch, 700, 20));
  EXPECT(pitch >= 700);
  print_ptr(reinterpret_cast<unsigned long long>(pitched), pitch * 20, "cudaMallocPitch");

  cudaStream_t stream;
  CHECK_RT(cudaStreamCreate(&stream));
  void* async_ptr = nullptr;
  if (cudaMallocAsync(&async_ptr, 4096, stream) == cudaSuccess) {
    print_ptr(reinterpret_cast<unsigned long long>(async_ptr), 4096, "cudaMallocAsync");
    CHECK_RT(cudaMemsetAsync(async_ptr, 0x5a, 4096, stream));
    unsigned char host[4096];
    CHECK_RT(cudaMemcpyAsync(host, async_ptr, 4096, cudaMemcpyDeviceToHost, stream));
    CHECK_RT(cudaStreamSynchronize(stream));
    for (unsigned char v : host) EXPECT(v == 0x5a);
    CHECK_RT(cudaFreeAsync(async_ptr, stream));
    CHECK_RT(cudaStreamSynchronize(stream));
  } else {
    (void)cudaGetLastError();
    std::printf("note cudaMallocAsync unsupported here\n");
  }

  size_t free_bytes = 0, total = 0;
  CHECK_RT(cudaMemGetInfo(&free_bytes, &total));
  EXPECT(free_bytes <= total && total > 0);

  void* zero = reinterpret_cast<void*>(1);
  CHECK_RT(cudaMalloc(&zero, 0));
  EXPECT(zero == nullptr);
  EXPECT(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CHECK_RT(cudaFree(nullptr));
  CHECK_RT(cudaFree(ptrs[0]));
  EXPECT(cudaFree(ptrs[0]) != cudaSuccess);  // double free
  (void)cudaGetLastError();

  for (size_t i = 1; i < ptrs.size(); ++i) CHECK_RT(cudaFree(ptrs[i]));
  CHECK_RT(cudaFree(pitched));
  CHECK_RT(cudaStreamDestroy(stream));
  std::printf("done\n");
  return 0;
}
