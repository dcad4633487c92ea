// The table of served entry points, built from served_entry_points.inc.
#include "served_entry_points.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "vmmckpt/support/driver_api.hpp"

#undef cuGetProcAddress  // cuda.h renames it to _v2; the v1 ABI is served too
// cudaGetDriverEntryPoint is deprecated, and still called by programs: we serve it.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// Served names that cuda.h and cuda_runtime_api.h do not declare under these names.
extern "C" {
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags);
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** dev_ptr, size_t size, cudaStream_t stream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* dev_ptr, cudaStream_t stream);
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** func, unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* status);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** func, unsigned int version,
                                                            unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* status);
}

namespace vmmckpt::detail {
namespace {

const served_entry entries[] = {
#define VMMCKPT_SERVED_DRIVER(symbol, proc_name, since, twin) \
  {#symbol, reinterpret_cast<void*>(&::symbol), proc_name, since, twin},
#define VMMCKPT_SERVED_RUNTIME(symbol) {#symbol, reinterpret_cast<void*>(&::symbol), nullptr, 0, nullptr},
#include "served_entry_points.inc"
#undef VMMCKPT_SERVED_DRIVER
#undef VMMCKPT_SERVED_RUNTIME
};

}  // namespace

std::span<const served_entry> served_entries() noexcept { return entries; }

const served_entry* served_by_symbol(std::string_view symbol) noexcept {
  for (const auto& e : entries)
    if (e.symbol == symbol) return &e;
  return nullptr;
}

}  // namespace vmmckpt::detail
