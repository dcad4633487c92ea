// Memory pools the program creates (cuMemPoolCreate, cudaMemPoolCreate): pools of pinned device memory that no
// other process imports are served by the shim's pool of that device, so that what is taken from them
// (cuMemAllocFromPoolAsync: NCCL's own pools, cudaMallocFromPoolAsync) is in images. The driver's pool is still
// made, empty, and answers what is not about bytes (docs/pool.md).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <optional>

namespace vmmckpt::detail {

// Whether the shim serves pools of these properties: pinned, on a device, shareable with no other process
// (an exportable pool's allocations would be imported elsewhere by the driver's own means).
bool servable_pool(const CUmemPoolProps& props);

// Records a pool the driver made for `props` (servable_pool() true); `by_nccl`: NCCL made it.
void note_program_pool(CUmemoryPool pool, const CUmemPoolProps& props, bool by_nccl) noexcept;
// The pool is destroyed: its allocations stay valid until freed, as the driver's do.
void forget_program_pool(CUmemoryPool pool) noexcept;

// An allocation from a served pool: CUDA_SUCCESS with *dptr, the pool's answer (out of memory past its
// maxSize), or nullopt when the pool is not served (the caller passes the call on).
std::optional<CUresult> allocate_from_program_pool(CUdeviceptr* dptr, std::size_t bytes, CUmemoryPool pool) noexcept;

// Set once something was taken from a served pool: until then a pool free skips program_pool_freed (one
// relaxed load on the hot path).
inline std::atomic<bool> any_taken_from_program_pools{false};

// A pointer of the shim's pool was freed; it counts no more in its program pool's use.
void program_pool_freed(std::uint64_t addr) noexcept;

// The answers of a served pool to the attributes about its bytes (used and reserved memory, now and at
// most): nullopt for another pool or attribute, which the driver answers.
std::optional<CUresult> program_pool_attribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) noexcept;

// Bytes taken now from the served pools NCCL made.
std::uint64_t nccl_pool_bytes() noexcept;

// cuMemPoolSetAccess on a served pool: the devices given access reach the shim's pool of its device.
void program_pool_access(CUmemoryPool pool, const CUmemAccessDesc* desc, std::size_t count) noexcept;

}  // namespace vmmckpt::detail
