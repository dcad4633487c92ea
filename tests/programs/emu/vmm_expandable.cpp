// Emulator test program: the VMM API as PyTorch's expandable segments call it.
//
// One reservation of 1.125 x device memory, 20 MiB handles created and mapped one by one, one
// cuMemSetAccess over many mappings, a hole unmapped and released in the middle and refilled, retain on
// an interior address, the program's own handle types read back, FABRIC refused, out of memory exact.
#include <cuda.h>

#include <atomic>
#include <string>
#include <thread>

#include "vmm_support.hpp"

using namespace vmmckpt::programs;
using vmmckpt::contracts::print_ptr;

namespace {

// Segments grown and emptied by 8 threads at once (PyTorch has segments per stream): every call
// succeeds, every thread finds its own bytes, and every handle goes back to the driver in the end.
int threads(CUcontext ctx) {
  size_t free_before = 0, total = 0;
  VMMCKPT_CHECK(cuMemGetInfo(&free_before, &total));
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++failures;
      constexpr size_t seg = 2u << 20;
      constexpr int slots = 6;
      const CUmemAllocationProp prop = device_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      const CUmemAccessDesc rw = read_write(0);
      for (int round = 0; round < 20; ++round) {
        CUdeviceptr base = 0;
        if (cuMemAddressReserve(&base, 4 * slots * seg, 0, 0, 0) != CUDA_SUCCESS) {
          ++failures;
          continue;
        }
        CUmemGenericAllocationHandle h[slots];
        for (int i = 0; i < slots; ++i)
          if (cuMemCreate(&h[i], seg, &prop, 0) != CUDA_SUCCESS ||
              cuMemMap(base + i * seg, seg, 0, h[i], 0) != CUDA_SUCCESS)
            ++failures;
        if (cuMemSetAccess(base, slots * seg, &rw, 1) != CUDA_SUCCESS) ++failures;
        const unsigned seed = 1000u * static_cast<unsigned>(t) + static_cast<unsigned>(round);
        write_pattern(base, slots * seg, seed);
        CUmemGenericAllocationHandle retained = 0;
        if (cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(base + 2 * seg + 1)) != CUDA_SUCCESS ||
            retained != h[2] || cuMemRelease(retained) != CUDA_SUCCESS)
          ++failures;
        if (!has_pattern(base, slots * seg, seed)) ++failures;
        if (cuMemUnmap(base, slots * seg) != CUDA_SUCCESS) ++failures;
        for (auto handle : h)
          if (cuMemRelease(handle) != CUDA_SUCCESS) ++failures;
        if (cuMemAddressFree(base, 4 * slots * seg) != CUDA_SUCCESS) ++failures;
      }
    });
  }
  for (auto& w : workers) w.join();
  size_t free_after = 0;
  VMMCKPT_CHECK(cuMemGetInfo(&free_after, &total));
  std::printf("threads: %d failures, free memory %s\n", failures.load(), free_after == free_before ? "back" : "short");
  VMMCKPT_EXPECT(failures == 0 && free_after == free_before);
  std::printf("done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const CUcontext ctx = start_cuda();
  if (argc == 2 && std::string(argv[1]) == "--threads") return threads(ctx);
  size_t total = 0, free_before = 0;
  VMMCKPT_CHECK(cuMemGetInfo(&free_before, &total));
  constexpr size_t seg = 20u << 20;
  constexpr int slots = 8;
  // PyTorch: FABRIC first; any error other than out of memory makes it use POSIX FDs from then on.
  CUmemAllocationProp prop = device_prop(0, CU_MEM_HANDLE_TYPE_FABRIC);
  CUmemGenericAllocationHandle h = 0;
  const CUresult fabric = cuMemCreate(&h, seg, &prop, 0);
  std::printf("fabric %s\n", error_name(fabric));
  VMMCKPT_EXPECT(fabric == CUDA_ERROR_NOT_SUPPORTED);
  size_t free_after = 0;
  VMMCKPT_CHECK(cuMemGetInfo(&free_after, &total));
  VMMCKPT_EXPECT(free_after == free_before);  // nothing was created
  prop = device_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

  const size_t reserve_size = (total + total / 8 + seg - 1) / seg * seg;
  CUdeviceptr base = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&base, reserve_size, 0, 0, 0));
  print_ptr(base, reserve_size, "cuMemAddressReserve");

  CUmemGenericAllocationHandle handles[slots];
  for (int i = 0; i < slots; ++i) {
    VMMCKPT_CHECK(cuMemCreate(&handles[i], seg, &prop, 0));
    print_token(handles[i], "cuMemCreate");
    VMMCKPT_CHECK(cuMemMap(base + i * seg, seg, 0, handles[i], 0));
  }
  // One call over all the mappings, then data in each.
  const CUmemAccessDesc rw = read_write(0);
  VMMCKPT_CHECK(cuMemSetAccess(base, slots * seg, &rw, 1));
  for (int i = 0; i < slots; ++i) write_pattern(base + i * seg, seg, 100 + i);

  // The program's own properties come back, exactly; the RDMA flag too.
  CUmemAllocationProp got{};
  VMMCKPT_CHECK(cuMemGetAllocationPropertiesFromHandle(&got, handles[0]));
  VMMCKPT_EXPECT(got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  VMMCKPT_EXPECT(got.location.type == CU_MEM_LOCATION_TYPE_DEVICE && got.location.id == 0);
  VMMCKPT_EXPECT(got.allocFlags.gpuDirectRDMACapable == 1);

  // A hole in the middle (PyTorch on out of memory or empty_cache), refilled from the lowest slot, with
  // no handle type this time (TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0): read back as none.
  VMMCKPT_CHECK(cuCtxSynchronize());
  VMMCKPT_CHECK(cuMemUnmap(base + 3 * seg, seg));
  VMMCKPT_CHECK(cuMemRelease(handles[3]));
  VMMCKPT_CHECK(cuMemUnmap(base + 4 * seg, seg));
  VMMCKPT_CHECK(cuMemRelease(handles[4]));
  const CUmemAllocationProp no_ipc = device_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  for (int i = 3; i <= 4; ++i) {
    VMMCKPT_CHECK(cuMemCreate(&handles[i], seg, &no_ipc, 0));
    print_token(handles[i], "refill");
    VMMCKPT_CHECK(cuMemMap(base + i * seg, seg, 0, handles[i], 0));
  }
  VMMCKPT_CHECK(cuMemSetAccess(base + 3 * seg, 2 * seg, &rw, 1));
  write_pattern(base + 3 * seg, seg, 203);
  VMMCKPT_CHECK(cuMemGetAllocationPropertiesFromHandle(&got, handles[3]));
  VMMCKPT_EXPECT(got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE);
  int fd = -1;
  VMMCKPT_EXPECT(cuMemExportToShareableHandle(&fd, handles[3], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
                 CUDA_ERROR_INVALID_VALUE);  // not created exportable, as far as the program knows
  for (int i = 0; i < slots; ++i)
    if (i != 3 && i != 4) VMMCKPT_EXPECT(has_pattern(base + i * seg, seg, 100 + i));
  VMMCKPT_EXPECT(has_pattern(base + 3 * seg, seg, 203));

  // Retain on an interior address names the handle mapped there, counted: one release gives it back.
  CUmemGenericAllocationHandle retained = 0;
  VMMCKPT_CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(base + 5 * seg + 12345)));
  VMMCKPT_EXPECT(retained == handles[5]);
  VMMCKPT_CHECK(cuMemRelease(retained));
  VMMCKPT_CHECK(cuMemGetAllocationPropertiesFromHandle(&got, handles[5]));  // still live

  // Out of memory is exactly that: PyTorch frees its cache and retries on it alone.
  CUmemGenericAllocationHandle huge = 0;
  const CUresult oom = cuMemCreate(&huge, (total / seg + 1) * seg, &prop, 0);
  std::printf("oversized %s\n", error_name(oom));
  VMMCKPT_EXPECT(oom == CUDA_ERROR_OUT_OF_MEMORY);

  // A second segment, as for another stream: right after the first.
  CUdeviceptr second = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&second, reserve_size, 0, 0, 0));
  print_ptr(second, reserve_size, "cuMemAddressReserve");

  VMMCKPT_CHECK(cuCtxSynchronize());
  VMMCKPT_CHECK(cuMemUnmap(base, slots * seg));  // one call over many mappings
  for (auto handle : handles) VMMCKPT_CHECK(cuMemRelease(handle));
  VMMCKPT_EXPECT(cuMemRelease(handles[0]) == CUDA_ERROR_INVALID_VALUE);  // released already
  VMMCKPT_CHECK(cuMemAddressFree(base, reserve_size));
  VMMCKPT_CHECK(cuMemAddressFree(second, reserve_size));
  VMMCKPT_CHECK(cuMemGetInfo(&free_after, &total));
  VMMCKPT_EXPECT(free_after == free_before);  // every handle went back to the driver
  std::printf("done\n");
  return 0;
}
