// The demo program: a toy model server's GPU state (weights, a KV cache, scratch), allocated through the driver API.
//
// Plain C++ against libcuda, no kernels: the same binary runs on a real GPU and
// on the emulated driver (NVIDIA's runtime does not run on the emulator).
//   vmmckpt-demo-app              allocate, fill, print where each buffer landed and its checksum, exit
//   vmmckpt-demo-app serve FILE   the same, record the table in FILE, print "ready", then stay up
//   vmmckpt-demo-app check FILE   in a restored process: read every buffer at its recorded address
//                                 (nothing allocated) and compare its checksum
#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
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

void init_device() {
  check(cuInit(0), "cuInit");
  CUdevice device;
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context;
  check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
}

// Reads back what `serve` recorded, from a process that allocated nothing.
int check_restored(const char* path) {
  init_device();
  std::ifstream in(path);
  std::string name;
  unsigned long long addr = 0, bytes = 0, checksum = 0;
  int good = 0, bad = 0;
  while (in >> name >> std::hex >> addr >> std::dec >> bytes >> std::hex >> checksum >> std::dec) {
    std::vector<unsigned char> back(bytes);
    check(cuMemcpyDtoH(back.data(), static_cast<CUdeviceptr>(addr), bytes), "cuMemcpyDtoH");
    const bool same = fnv1a(back) == checksum;
    std::printf("%-16s 0x%-16llx %s\n", name.c_str(), addr, same ? "same bytes" : "DIFFERENT");
    (same ? good : bad)++;
  }
  std::printf("%d buffers back at their addresses with their bytes, %d not\n", good, bad);
  return bad == 0 && good > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "check") == 0) return check_restored(argv[2]);
  const char* serve_file = argc == 3 && std::strcmp(argv[1], "serve") == 0 ? argv[2] : nullptr;
  std::vector<buffer> buffers = {
      {"embedding", 24u << 20}, {"layer0.weights", 16u << 20}, {"layer1.weights", 16u << 20},
      {"kv_cache", 64u << 20},  {"logits", 3u << 20},          {"scratch", 4096},
  };
  init_device();
  CUdevice device;
  check(cuCtxGetDevice(&device), "cuCtxGetDevice");
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
    if (serve_file != nullptr) {
      std::ofstream out(serve_file, std::ios::app);
      out << b.name << " " << std::hex << b.device << " " << std::dec << b.bytes << " " << std::hex << fnv1a(back)
          << "\n";
    }
  }
  if (serve_file != nullptr) {
    std::printf("ready\n");
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // serving, until stopped
  }
  for (buffer& b : buffers) check(cuMemFree(b.device), "cuMemFree");
  return 0;
}
