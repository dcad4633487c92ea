// Physical memory for a pool from the real driver: POSIX-FD-exportable VMM handles.
#pragma once

#include <cuda.h>

#include "vmmckpt/device_pool.hpp"

namespace vmmckpt::detail {

class cuda_backend final : public physical_backend {
 public:
  cuda_backend(CUdevice device, CUcontext primary) : device_(device), primary_(primary) {}

  int map_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t& handle) override;
  void unmap_segment(std::uint64_t addr, std::uint64_t size, std::uint64_t handle) override;
  void synchronize() override;
  std::uint64_t submitted_work() const override;
  bool is_out_of_memory(int error) const override { return error == CUDA_ERROR_OUT_OF_MEMORY; }

  // The properties every pool handle is created with.
  static CUmemAllocationProp allocation_properties(CUdevice device);

 private:
  CUdevice device_;
  CUcontext primary_;
};

}  // namespace vmmckpt::detail
