// The demo program: a toy model server's GPU state (weights, a KV cache, scratch), allocated through the driver API.
//
// Plain C++ against libcuda, no kernels: the same binary runs on a real GPU and
// on the emulated driver (NVIDIA's runtime does not run on the emulator). It
// prints where each buffer landed and a checksum of its contents, which it
// writes and reads back through the device.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

struct buffer {
  const char* name;
  std::size_t bytes;
  CUdeviceptr device = 0;
};

void check(CUresult e, const char* what) {
  if (e != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(e, &name);
    std::fprintf(stderr, "demo: %s failed: %s\n", what, name ? name : "unknown error");
    std::exit(1);
  }
}

std::uint64_t fnv1a(const std::vector<unsigned char>& bytes) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ULL;
  return h;
}

}  // namespace

int main() {
  std::vector<buffer> buffers = {
      {"embedding", 24u << 20}, {"layer0.weights", 16u << 20}, {"layer1.weights", 16u << 20},
      {"kv_cache", 64u << 20},  {"logits", 3u << 20},          {"scratch", 4096},
  };
  check(cuInit(0), "cuInit");
  CUdevice device;
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context;
  check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  char name[256] = {};
  check(cuDeviceGetName(name, sizeof name - 1, device), "cuDeviceGetName");
  std::printf("device 0: %s\n", name);
  std::printf("%-16s %10s  %-18s %-18s\n", "buffer", "bytes", "address", "checksum");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    buffer& b = buffers[i];
    check(cuMemAlloc(&b.device, b.bytes), "cuMemAlloc");
    std::vector<unsigned char> host(b.bytes);
    for (std::size_t k = 0; k < host.size(); ++k) host[k] = static_cast<unsigned char>(k * 31 + i * 7);
    check(cuMemcpyHtoD(b.device, host.data(), b.bytes), "cuMemcpyHtoD");
    std::vector<unsigned char> back(b.bytes);
    check(cuMemcpyDtoH(back.data(), b.device, b.bytes), "cuMemcpyDtoH");
    if (back != host) {
      std::fprintf(stderr, "demo: %s did not read back what was written\n", b.name);
      return 1;
    }
    std::printf("%-16s %10zu  0x%-16llx 0x%016llx\n", b.name, b.bytes, static_cast<unsigned long long>(b.device),
                static_cast<unsigned long long>(fnv1a(back)));
  }
  for (buffer& b : buffers) check(cuMemFree(b.device), "cuMemFree");
  return 0;
}
