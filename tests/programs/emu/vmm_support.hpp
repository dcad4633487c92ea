// What the VMM test programs share: the allocation properties they ask for, and the lines they print.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

namespace vmmckpt::programs {

inline CUmemAllocationProp device_prop(int device, unsigned handle_types, bool rdma = true) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(handle_types);
  prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  return prop;
}

inline CUmemAccessDesc read_write(int device) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

// `token 0x<value> <what>`: the handle values a program got, compared across runs by the e2e tests.
inline void print_token(CUmemGenericAllocationHandle h, const char* what) {
  std::printf("token 0x%llx %s\n", static_cast<unsigned long long>(h), what);
}

// Fills [p, p + bytes) with a pattern of `seed` through the driver, and checks it.
inline void write_pattern(CUdeviceptr p, std::size_t bytes, unsigned seed) {
  std::vector<unsigned> host(bytes / sizeof(unsigned));
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = seed * 2654435761u + static_cast<unsigned>(i);
  VMMCKPT_CHECK(cuMemcpyHtoD(p, host.data(), host.size() * sizeof(unsigned)));
}

inline bool has_pattern(CUdeviceptr p, std::size_t bytes, unsigned seed) {
  std::vector<unsigned> host(bytes / sizeof(unsigned));
  VMMCKPT_CHECK(cuMemcpyDtoH(host.data(), p, host.size() * sizeof(unsigned)));
  for (std::size_t i = 0; i < host.size(); ++i)
    if (host[i] != seed * 2654435761u + static_cast<unsigned>(i)) return false;
  return true;
}

inline CUcontext start_cuda(int device = 0) {
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

}  // namespace vmmckpt::programs
