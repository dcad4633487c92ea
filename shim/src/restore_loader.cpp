// Restoring an image into a new process: at its first memory call, the image's allocations come back at their addresses.
#include "restore_loader.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "image_loader.hpp"
#include "log.hpp"
#include "pools.hpp"
#include "real_symbols.hpp"
#include "vmmckpt/image.hpp"
#include "vmmckpt/pool_layout.hpp"

namespace vmmckpt::detail {
namespace {

enum state : int { unchecked, nothing_to_restore, restored, failed };
std::atomic<int> g_state{unchecked};

alloc_api api_from_name(const std::string& name) {
  for (auto api : {alloc_api::cu_mem_alloc, alloc_api::cu_mem_alloc_pitch, alloc_api::cu_mem_alloc_async,
                   alloc_api::cuda_malloc, alloc_api::cuda_malloc_pitch, alloc_api::cuda_malloc_async})
    if (name_of(api) == name) return api;
  return alloc_api::cu_mem_alloc;
}

const char* why(pool_status s) {
  switch (s) {
    case pool_status::out_of_memory: return "not enough GPU memory";
    case pool_status::invalid_value: return "its range is not free in this process's pool";
    default: return "the driver refused";
  }
}

bool restore_image(const std::string& path, bool replay) {
  const auto start = std::chrono::steady_clock::now();
  const driver_api* d = driver();
  if (d == nullptr) return false;
  try {
    const auto reader = image::reader::open(path);
    // Extents are checked as they load; the manifest is checked first (the tool checked the image
    // too, but it may have changed since).
    reader.verify_manifest();
    const image::manifest& m = reader.info();
    std::uint64_t bytes = 0;
    std::size_t blocks = 0;
    for (const image::pool& p : m.pools) {
      device_pool* pool = nullptr;
      if (const CUresult e = acquire_pool(p.device, pool); e != CUDA_SUCCESS) {
        log::error("restore: no pool on device {} (CUDA error {}); see the error above", p.device, static_cast<int>(e));
        return false;
      }
      if (pool->base() != p.base || pool->size() != p.size) {
        log::error("restore: the image's pool is [{:#x}, +{}) but this process's is [{:#x}, +{})", p.base, p.size,
                   pool->base(), pool->size());
        return false;
      }
      for (const image::allocation& a : p.allocations) {
        int backend_error = 0;
        const pool_status s = replay ? pool->prefill(align_down(a.addr, small_alignment),
                                                     align_up(a.size, small_alignment), &backend_error)
                                     : pool->restore_block(a.addr, a.size, api_from_name(a.api), &backend_error);
        if (s != pool_status::ok) {
          log::error("restore: cannot place the allocation at {:#x} ({} bytes): {}", a.addr, a.size, why(s));
          return false;
        }
        ++blocks;
      }
      for (const image::extent& e : p.extents) bytes += e.size;
    }
    const auto placed = std::chrono::steady_clock::now();
    if (std::string error; !load_image(*d, reader, error)) {
      log::error("restore: {}", error);
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - start).count();
    log::info("restore: {} allocations, {} bytes from {} in {:.3f} s (placing {:.3f} s, loading {:.3f} s){}", blocks,
              bytes, path, seconds, std::chrono::duration<double>(placed - start).count(),
              std::chrono::duration<double>(now - placed).count(), replay ? " (replay: the allocator starts empty)" : "");
    return true;
  } catch (const std::exception& e) {
    log::error("restore from {} failed: {}", path, e.what());
    return false;
  }
}

bool restore_slow_path() {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  int s = g_state.load(std::memory_order_acquire);
  if (s != unchecked) return s != failed;
  // Only the process cuda-ckpt restore started (exec keeps its pid), never
  // its children, which inherit the environment.
  const char* path = std::getenv("VMMCKPT_RESTORE_IMAGE");
  const char* pid = std::getenv("VMMCKPT_RESTORE_PID");
  if (path == nullptr || *path == '\0' || pid == nullptr || std::atol(pid) != static_cast<long>(getpid())) {
    g_state.store(nothing_to_restore, std::memory_order_release);
    return true;
  }
  const char* mode = std::getenv("VMMCKPT_RESTORE_MODE");
  const bool replay = mode != nullptr && std::string(mode) == "replay";
  const bool ok = restore_image(path, replay);
  if (!ok) log::error("restore: the image was not restored; every memory call of this process will fail");
  g_state.store(ok ? restored : failed, std::memory_order_release);
  return ok;
}

}  // namespace

bool refill_pools_from_image(const std::string& path, std::string& error, std::uint64_t& bytes) {
  const driver_api* d = driver();
  if (d == nullptr) {
    error = "no driver";
    return false;
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<device_pool*> rebuilt;
  auto undo = [&] {
    for (device_pool* p : rebuilt) p->release_all_physical();
  };
  try {
    const auto reader = image::reader::open(path);
    reader.verify_manifest();  // extents are checked as they load
    bytes = 0;
    for (const image::pool& p : reader.info().pools) {
      device_pool* pool = pool_containing(p.base);
      if (pool == nullptr || pool->base() != p.base) {
        error = "the image's pool at " + std::to_string(p.base) + " is not this program's";
        undo();
        return false;
      }
      const auto live = pool->live_blocks();
      bool same = live.size() == p.allocations.size();
      for (std::size_t i = 0; same && i < live.size(); ++i)
        same = live[i].addr == p.allocations[i].addr && live[i].requested == p.allocations[i].size;
      if (!same) {
        error = "the image's allocations are not the suspended program's";
        undo();
        return false;
      }
      int backend_error = 0;
      const pool_status s = pool->rebuild_physical(&backend_error);
      if (s != pool_status::ok) {
        error = std::string(why(s)) + " to resume device " + std::to_string(p.device);
        undo();
        return false;
      }
      rebuilt.push_back(pool);
      for (const image::extent& e : p.extents) bytes += e.size;
    }
    const auto loading = std::chrono::steady_clock::now();
    if (!load_image(*d, reader, error)) {
      undo();
      return false;
    }
    log::info("resume: physical memory back in {:.3f} s, {} bytes loaded in {:.3f} s",
              std::chrono::duration<double>(loading - start).count(), bytes,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - loading).count());
    return true;
  } catch (const std::exception& e) {
    error = e.what();
    undo();
    return false;
  }
}

bool restore_ready() {
  const int s = g_state.load(std::memory_order_acquire);
  if (s == nothing_to_restore || s == restored) return true;
  if (s == failed) return false;
  return restore_slow_path();
}

}  // namespace vmmckpt::detail
