// The API through which an allocation entered the pool; recorded with every block.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace vmmckpt {

enum class alloc_api : std::uint32_t {
  cu_mem_alloc = 1,
  cu_mem_alloc_pitch,
  cu_mem_alloc_async,
  cuda_malloc,
  cuda_malloc_pitch,
  cuda_malloc_async,
  cu_mem_map,                    // a mapping of program-made VMM memory: the records of an image's pools of kind vmm
  cu_mem_alloc_from_pool_async,  // from a memory pool the program created (cudaMallocFromPoolAsync too)
};

inline constexpr alloc_api all_alloc_apis[] = {alloc_api::cu_mem_alloc,       alloc_api::cu_mem_alloc_pitch,
                                               alloc_api::cu_mem_alloc_async, alloc_api::cuda_malloc,
                                               alloc_api::cuda_malloc_pitch,  alloc_api::cuda_malloc_async,
                                               alloc_api::cu_mem_map,         alloc_api::cu_mem_alloc_from_pool_async};

constexpr std::string_view name_of(alloc_api api) {
  switch (api) {
    case alloc_api::cu_mem_alloc: return "cuMemAlloc";
    case alloc_api::cu_mem_alloc_pitch: return "cuMemAllocPitch";
    case alloc_api::cu_mem_alloc_async: return "cuMemAllocAsync";
    case alloc_api::cuda_malloc: return "cudaMalloc";
    case alloc_api::cuda_malloc_pitch: return "cudaMallocPitch";
    case alloc_api::cuda_malloc_async: return "cudaMallocAsync";
    case alloc_api::cu_mem_map: return "cuMemMap";
    case alloc_api::cu_mem_alloc_from_pool_async: return "cuMemAllocFromPoolAsync";
  }
  return "unknown";
}

// The API of a record's number (alloc_api's value); nothing for any other number.
constexpr std::optional<alloc_api> alloc_api_from_value(std::uint32_t value) {
  for (alloc_api api : all_alloc_apis)
    if (static_cast<std::uint32_t>(api) == value) return api;
  return std::nullopt;
}

// The API named as name_of() writes it (in images and control messages); nothing for any other name.
constexpr std::optional<alloc_api> alloc_api_from_name(std::string_view name) {
  for (alloc_api api : all_alloc_apis)
    if (name_of(api) == name) return api;
  return std::nullopt;
}

// One live block as the program asked for it: where, how many bytes, through which API. The same
// record travels in the control protocol's allocation table and in an image's tables.
struct allocation {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;  // the size the program asked for
  alloc_api api = alloc_api::cuda_malloc;
  friend bool operator==(const allocation&, const allocation&) = default;
};

}  // namespace vmmckpt
