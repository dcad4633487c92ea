// An image's allocations back in a process's pools: placed at the start of a restored process, or backed again on resume.
#include "vmmckpt/restore/pool_restore.hpp"

#include "vmmckpt/pool/alloc_api.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt::restore {
namespace {

const char* why(pool_status s) {
  switch (s) {
    case pool_status::out_of_memory: return "not enough GPU memory";
    case pool_status::invalid_value: return "its range is not free in this process's pool";
    default: return "the driver refused";
  }
}

CUresult cuda_result(pool_status s, int backend_error) {
  if (s == pool_status::backend_error && backend_error != 0) return static_cast<CUresult>(backend_error);
  return s == pool_status::invalid_value ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
}

}  // namespace

status place_allocations(const image::manifest& m, mode how, const pool_for_device& pool_for) noexcept {
  try {
    for (const image::pool& p : m.pools) {
      if (p.kind == image::pool_kind::vmm) continue;  // the shim's VMM registry rebuilds those
      device_pool* pool = nullptr;
      if (const status got = pool_for(p.device, pool); !got.ok())
        return failure(got.code(), "restore: no pool on device {}: {}", p.device, got.message());
      if (pool->base() != p.base || pool->size() != p.size)
        return failure(CUDA_ERROR_INVALID_VALUE,
                       "restore: the image's pool is [{}, +{}) but this process's is [{}, +{})", hex(p.base), p.size,
                       hex(pool->base()), pool->size());
      for (const image::allocation& a : p.allocations) {
        int backend_error = 0;
        // The image's rules admit only known API names (image::validate).
        const alloc_api api = a.api;
        const pool_status s = how == mode::replay ? pool->prefill(align_down(a.addr, small_alignment),
                                                                  align_up(a.size, small_alignment), &backend_error)
                                                  : pool->restore_block(a.addr, a.size, api, &backend_error);
        if (s != pool_status::ok)
          return failure(cuda_result(s, backend_error), "restore: cannot place the allocation at {} ({} bytes): {}",
                         hex(a.addr), a.size, why(s));
      }
    }
    return {};
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "restore: {}", e.what());
  }
}

status back_suspended_pools(const image::manifest& m, const pool_at_base& pool_at,
                            std::vector<device_pool*>& backed) noexcept {
  try {
    for (const image::pool& p : m.pools) {
      if (p.kind == image::pool_kind::vmm) continue;  // the shim's VMM registry rebuilds those
      device_pool* pool = pool_at(p.base);
      if (pool == nullptr || pool->base() != p.base) {
        release_pools(backed);
        return failure(CUDA_ERROR_INVALID_VALUE, "the image's pool at {} is not this program's", hex(p.base));
      }
      const auto live = pool->live_blocks();
      bool same = live.size() == p.allocations.size();
      for (std::size_t i = 0; same && i < live.size(); ++i)
        same = live[i].addr == p.allocations[i].addr && live[i].requested == p.allocations[i].size;
      if (!same) {
        release_pools(backed);
        return failure(CUDA_ERROR_INVALID_VALUE, "the image's allocations are not the suspended program's");
      }
      int backend_error = 0;
      const pool_status s = pool->rebuild_physical(&backend_error);
      if (s != pool_status::ok) {
        release_pools(backed);
        return failure(cuda_result(s, backend_error), "{} to resume device {}", why(s), p.device);
      }
      backed.push_back(pool);
    }
    return {};
  } catch (const std::exception& e) {
    release_pools(backed);
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "resume: {}", e.what());
  }
}

void release_pools(const std::vector<device_pool*>& pools) noexcept {
  for (device_pool* p : pools) {
    try {
      p->release_all_physical();
    } catch (...) {
      log::error("giving back pool memory at {} failed: out of memory", hex(p->base()));
    }
  }
}

}  // namespace vmmckpt::restore
