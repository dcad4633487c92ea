// What the copy pipeline copies through: pinned staging buffers with their copy streams, and spare device memory
// for a snapshot of the program's live bytes (copy_pipeline.hpp).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/cuda_check.hpp"
#include "vmmckpt/support/host_pages.hpp"

namespace vmmckpt::ckpt {

// Pinned staging buffers and copy streams, released in every case. The buffers are one block of
// pre-faulted memory registered with the driver (much cheaper to pin than cuMemHostAlloc), or
// cuMemHostAlloc buffers where registering is refused.
struct copy_staging {
  host_pages pages;
  bool registered = false;
  std::vector<void*> allocated;
  std::vector<unsigned char*> buffers;
  std::vector<CUevent> events;
  std::vector<CUstream> streams;
  // The checksum kernel's own stream: waiting for the copy streams never waits for it.
  CUstream checksum_stream = nullptr;

  // The pages alone (no CUDA call): faulted in while the tool's context is being made.
  void reserve(int count, std::size_t bytes) { pages = host_pages(static_cast<std::size_t>(count) * bytes, 8); }

  // With a current context: pins the reserved pages, or allocates pinned buffers instead.
  void allocate(int count, std::size_t bytes) {
    const driver_api& d = driver();
    if (pages.size() != static_cast<std::size_t>(count) * bytes) reserve(count, bytes);
    if (pages.data() != nullptr && d.cuMemHostRegister_v2(pages.data(), pages.size(), 0) == CUDA_SUCCESS) {
      registered = true;
      for (int i = 0; i < count; ++i) buffers.push_back(static_cast<unsigned char*>(pages.data()) + i * bytes);
    } else {
      pages = host_pages();
      for (int i = 0; i < count; ++i) {
        void* b = nullptr;
        VMMCKPT_CUDA_TRY(d.cuMemHostAlloc(&b, bytes, 0));
        allocated.push_back(b);
        buffers.push_back(static_cast<unsigned char*>(b));
      }
    }
    for (int i = 0; i < count; ++i) {
      CUevent e;
      VMMCKPT_CUDA_TRY(d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC));
      events.push_back(e);
    }
  }
  // Waits for every copy and checksum queued (errors ignored: a failed stream has nothing left to run).
  void drain() const noexcept {
    if (streams.empty() && checksum_stream == nullptr) return;  // no driver needed
    const driver_api& d = driver();                             // loaded: it made them
    for (CUstream s : streams) d.cuStreamSynchronize(s);
    if (checksum_stream != nullptr) d.cuStreamSynchronize(checksum_stream);
  }
  ~copy_staging() {
    if (!registered && allocated.empty() && events.empty() && streams.empty()) return;  // no driver needed
    const driver_api& d = driver();                                                     // loaded: it made them
    drain();
    if (checksum_stream != nullptr) streams.push_back(checksum_stream);
    if (registered) d.cuMemHostUnregister(pages.data());
    for (void* b : allocated) d.cuMemFreeHost(b);
    for (CUevent e : events) d.cuEventDestroy_v2(e);
    for (CUstream s : streams) d.cuStreamDestroy_v2(s);
  }
};

// Device memory in this tool's context holding a copy of the program's live bytes, or of as many of
// them as the device has room for.
struct gpu_snapshot {
  CUdeviceptr ptr = 0;
  std::uint64_t bytes = 0;
  // Up to `want` bytes, leaving a quarter of the device free: the program must not run out of
  // memory because a dump borrowed it. Less than `least` is not worth it.
  void try_allocate(std::uint64_t want, std::uint64_t least) {
    const driver_api& d = driver();
    std::size_t free = 0, total = 0;
    if (d.cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS || free <= total / 4) return;
    const std::uint64_t n = std::min<std::uint64_t>(want, (free - total / 4) & ~((2ULL << 20) - 1));
    if (n < least) return;
    if (d.cuMemAlloc_v2(&ptr, n) != CUDA_SUCCESS) {
      ptr = 0;
      return;
    }
    bytes = n;
  }
  void release() {
    if (ptr != 0) {
      const driver_api& d = driver();  // loaded: it allocated ptr
      d.cuCtxSynchronize();            // no copy may still read it
      d.cuMemFree_v2(ptr);
    }
    ptr = 0;
    bytes = 0;
  }
  ~gpu_snapshot() { release(); }
};

}  // namespace vmmckpt::ckpt
