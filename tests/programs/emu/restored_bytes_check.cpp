// Emulator test program: started by `cuda-ckpt restore IMAGE -- restored_bytes_check IMAGE`, checks that its
// device memory holds exactly the image's bytes at the image's addresses.
//
// Prints "restored N allocations, B bytes, all equal" and exits 0, or names the first difference and
// exits 1. The image is read through the project's reader (every extent's checksum checked).
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "support/cuda_check.hpp"
#include "vmmckpt/image/image.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s IMAGE\n", argv[0]);
    return 2;
  }
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  // The image comes back at the process's first memory call.
  CUdeviceptr probe = 0;
  VMMCKPT_CHECK(cuMemAlloc(&probe, 4096));
  const auto reader = vmmckpt::image::reader::open(argv[1]);
  std::size_t allocations = 0;
  std::uint64_t bytes = 0;
  std::vector<unsigned char> expected, got;
  for (const auto& pool : reader.info().pools) {
    allocations += pool.allocations.size();
    for (const auto& e : pool.extents) {
      expected.resize(e.stored);
      reader.read(e, expected.data());
      // Each allocation's part of the extent, where the image says it belongs.
      for (const auto& r : vmmckpt::image::stored_runs(pool, e)) {
        got.resize(r.size);
        VMMCKPT_CHECK(cuMemcpyDtoH(got.data(), r.addr, r.size));
        if (std::memcmp(got.data(), expected.data() + r.offset, r.size) != 0) {
          std::printf("the bytes at 0x%llx (%llu of them) differ from the image\n",
                      static_cast<unsigned long long>(r.addr), static_cast<unsigned long long>(r.size));
          return 1;
        }
      }
      bytes += e.stored;
    }
  }
  VMMCKPT_CHECK(cuMemFree(probe));
  std::printf("restored %zu allocations, %llu bytes, all equal\n", allocations, static_cast<unsigned long long>(bytes));
  return 0;
}
