// Emulator test program: allocations through the runtime API (linked shared or static cudart).
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

using vmmckpt::contracts::print_ptr;

int main(int argc, char** argv) {
  const bool exhaust = argc > 1 && std::strcmp(argv[1], "--exhaust") == 0;
  int count = 0;
  VMMCKPT_CHECK(cudaGetDeviceCount(&count));
  VMMCKPT_EXPECT(count >= 1);
  VMMCKPT_CHECK(cudaSetDevice(0));

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
    VMMCKPT_EXPECT(e == cudaErrorMemoryAllocation);
    VMMCKPT_EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    VMMCKPT_EXPECT(cudaGetLastError() == cudaSuccess);
    for (void* p : held) VMMCKPT_CHECK(cudaFree(p));
    void* again = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&again, 256 << 20));  // usable again after frees
    print_ptr(reinterpret_cast<unsigned long long>(again), 256 << 20, "cudaMalloc");
    std::printf("done\n");
    return 0;
  }

  const size_t sizes[] = {256, 10000, 1 << 20, 3 << 20, 32 << 20};
  std::vector<void*> ptrs;
  for (size_t size : sizes) {
    void* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, size));
    VMMCKPT_EXPECT(reinterpret_cast<uintptr_t>(p) % 256 == 0);
    print_ptr(reinterpret_cast<unsigned long long>(p), size, "cudaMalloc");
    std::vector<unsigned char> out(size), in(size);
    for (size_t i = 0; i < size; ++i) out[i] = static_cast<unsigned char>(i ^ size);
    VMMCKPT_CHECK(cudaMemcpy(p, out.data(), size, cudaMemcpyHostToDevice));
    VMMCKPT_CHECK(cudaMemcpy(in.data(), p, size, cudaMemcpyDeviceToHost));
    VMMCKPT_EXPECT(in == out);
    ptrs.push_back(p);
  }

  void* pitched = nullptr;
  size_t pitch = 0;
  VMMCKPT_CHECK(cudaMallocPitch(&pitched, &pitch, 700, 20));
  VMMCKPT_EXPECT(pitch >= 700);
  print_ptr(reinterpret_cast<unsigned long long>(pitched), pitch * 20, "cudaMallocPitch");

  cudaStream_t stream;
  VMMCKPT_CHECK(cudaStreamCreate(&stream));
  void* async_ptr = nullptr;
  if (cudaMallocAsync(&async_ptr, 4096, stream) == cudaSuccess) {
    print_ptr(reinterpret_cast<unsigned long long>(async_ptr), 4096, "cudaMallocAsync");
    VMMCKPT_CHECK(cudaMemsetAsync(async_ptr, 0x5a, 4096, stream));
    unsigned char host[4096];
    VMMCKPT_CHECK(cudaMemcpyAsync(host, async_ptr, 4096, cudaMemcpyDeviceToHost, stream));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
    for (unsigned char v : host) VMMCKPT_EXPECT(v == 0x5a);
    VMMCKPT_CHECK(cudaFreeAsync(async_ptr, stream));
    VMMCKPT_CHECK(cudaStreamSynchronize(stream));
  } else {
    (void)cudaGetLastError();
    std::printf("note cudaMallocAsync unsupported here\n");
  }

  size_t free_bytes = 0, total = 0;
  VMMCKPT_CHECK(cudaMemGetInfo(&free_bytes, &total));
  VMMCKPT_EXPECT(free_bytes <= total && total > 0);

  void* zero = reinterpret_cast<void*>(1);
  VMMCKPT_CHECK(cudaMalloc(&zero, 0));
  VMMCKPT_EXPECT(zero == nullptr);
  VMMCKPT_EXPECT(cudaMalloc(nullptr, 16) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  VMMCKPT_CHECK(cudaFree(nullptr));
  VMMCKPT_CHECK(cudaFree(ptrs[0]));
  VMMCKPT_EXPECT(cudaFree(ptrs[0]) != cudaSuccess);  // double free
  (void)cudaGetLastError();

  for (size_t i = 1; i < ptrs.size(); ++i) VMMCKPT_CHECK(cudaFree(ptrs[i]));
  VMMCKPT_CHECK(cudaFree(pitched));
  VMMCKPT_CHECK(cudaStreamDestroy(stream));
  std::printf("done\n");
  return 0;
}
