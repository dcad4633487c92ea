// Runs NVIDIA's real CUDA runtime (shared or static) on the emulator. Today cudart stops at its
// first call because it needs the driver's private export tables (docs/emulator.md, "The real CUDA
// runtime"); this program checks that it stops cleanly, with an error and without a crash or hang,
// and runs the whole host-side runtime flow if it ever gets further.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#define CHECK(call)                                                                       \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s (%d)\n", #call, cudaGetErrorString(e_), (int)e_); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

static void CUDART_CB set_flag(void* p) { *static_cast<int*>(p) = 1; }

static int full_flow() {
  CHECK(cudaSetDevice(0));
  int dev = -1;
  CHECK(cudaGetDevice(&dev));
  void* d = nullptr;
  CHECK(cudaMalloc(&d, 1 << 20));
  char in[16] = "emulated";
  char out[16] = {};
  CHECK(cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
  if (std::strcmp(in, out) != 0) return 1;
  CHECK(cudaMemset(d, 0, 16));
  void* pitched = nullptr;
  size_t pitch = 0;
  CHECK(cudaMallocPitch(&pitched, &pitch, 100, 4));
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMemcpyAsync(d, in, sizeof in, cudaMemcpyHostToDevice, s));
  int flag = 0;
  CHECK(cudaLaunchHostFunc(s, set_flag, &flag));
  CHECK(cudaStreamSynchronize(s));
  if (flag != 1) return 1;
  void* a = nullptr;
  if (cudaMallocAsync(&a, 4096, s) == cudaSuccess) CHECK(cudaFreeAsync(a, s));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 13000, cudaEnableDefault, &q));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(pitched));
  CHECK(cudaFree(d));
  std::printf("cudart: full host-side flow passed\n");
  return 0;
}

int main() {
  int count = -1;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // The known boundary: report it and check that the driver underneath is still usable.
    std::printf("cudart boundary: cudaGetDeviceCount -> %s (%d)\n", cudaGetErrorName(e), (int)e);
    CUdevice dev = -1;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) return 1;
    return 0;
  }
  if (count < 1) return 1;
  return full_flow();
}
