// The API through which an allocation entered the pool; recorded with every block.
#pragma once

#include <cstdint>
#include <string_view>

namespace vmmckpt {

enum class alloc_api : std::uint32_t {
  cu_mem_alloc = 1,
  cu_mem_alloc_pitch,
  cu_mem_alloc_async,
  cuda_malloc,
  cuda_malloc_pitch,
  cuda_malloc_async,
};

constexpr std::string_view name_of(alloc_api api) {
  switch (api) {
    case alloc_api::cu_mem_alloc: return "cuMemAlloc";
    case alloc_api::cu_mem_alloc_pitch: return "cuMemAllocPitch";
    case alloc_api::cu_mem_alloc_async: return "cuMemAllocAsync";
    case alloc_api::cuda_malloc: return "cudaMalloc";
    case alloc_api::cuda_malloc_pitch: return "cudaMallocPitch";
    case alloc_api::cuda_malloc_async: return "cudaMallocAsync";
  }
  return "unknown";
}

}  // namespace vmmckpt
