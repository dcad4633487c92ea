// Physical memory for a pool from the real driver: POSIX-FD-exportable VMM handles.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>

#include "vmmckpt/pool/device_pool.hpp"

namespace vmmckpt::detail {

class cuda_backend final : public physical_backend {
 public:
  // `peers`: the devices besides this one that the pool's memory is accessible from (bit d: device d),
  // read at every mapping; pools.cpp owns it, since a grant may come before the pool exists.
  cuda_backend(CUdevice device, CUcontext primary, const std::atomic<std::uint32_t>& peers)
      : device_(device), primary_(primary), peers_(peers) {}

  int map_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t& handle) override;
  void unmap_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t handle) override;
  void synchronize() override;
  std::uint64_t submitted_work() const override;
  bool is_out_of_memory(int error) const override { return error == CUDA_ERROR_OUT_OF_MEMORY; }

  // The properties every pool handle is created with.
  static CUmemAllocationProp allocation_properties(CUdevice device);
  // Read and write access from `device`: what pool memory (and memory imported through IPC) is mapped with.
  static CUmemAccessDesc read_write_from(int device);

  // Makes every segment of the pool accessible from `peer` as well (the caller holds off concurrent
  // grants; the pool's lock, held meanwhile, holds off mappings). CUDA_SUCCESS or the first failure.
  CUresult grant_existing(const device_pool& pool, CUdevice peer);

 private:
  CUdevice device_;
  CUcontext primary_;
  const std::atomic<std::uint32_t>& peers_;
};

}  // namespace vmmckpt::detail
