// Restoring an image into a new process: at its first memory call, the image's allocations come back at their addresses.
#include "restore_at_start.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "pools.hpp"
#include "real_symbols.hpp"
#include "vmm_checkpoint.hpp"
#include "vmmckpt/log.hpp"
#include "vmmckpt/restore/handoff.hpp"
#include "vmmckpt/restore/pool_restore.hpp"
#include "vmmckpt/restore/upload.hpp"

namespace vmmckpt::detail {
namespace {

enum state : int { unchecked, nothing_to_restore, restored, failed };
std::atomic<int> g_state{unchecked};

status restore_image(const restore::handoff& h) noexcept {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const driver_api* d = driver();
  if (d == nullptr) return failure(CUDA_ERROR_NOT_INITIALIZED, "restore: no CUDA driver");
  try {
    const auto reader = image::reader::open(h.image);
    // Extents are checked as they load; the manifest is checked first (the tool checked the image
    // too, but it may have changed since).
    reader.verify_manifest();
    const image::manifest& m = reader.info();
    VMMCKPT_TRY(restore::place_allocations(m, h.how, acquire_pool));
    if (h.how == restore::mode::replay)
      VMMCKPT_TRY(vmm_prepare_replay(h.image, m));
    else
      VMMCKPT_TRY(vmm_restore_layout(m));
    const auto placed = clock::now();
    VMMCKPT_TRY(restore::upload(*d, reader, pool_memory_backed(), h.how != restore::mode::replay));
    const auto now = clock::now();
    std::size_t blocks = 0;
    for (const auto& p : m.pools) blocks += p.allocations.size();
    log::info("restore: {} allocations, {} bytes from {} in {:.3f} s (placing {:.3f} s, loading {:.3f} s){}", blocks,
              m.data_bytes, h.image, std::chrono::duration<double>(now - start).count(),
              std::chrono::duration<double>(placed - start).count(), std::chrono::duration<double>(now - placed).count(),
              h.how == restore::mode::replay ? " (replay: the allocator starts empty)" : "");
    return {};
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_INVALID_VALUE, "restore from {} failed: {}", h.image, e.what());
  }
}

bool restore_slow_path() noexcept {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  const int s = g_state.load(std::memory_order_acquire);
  if (s != unchecked) return s != failed;
  // Only the process cuda-ckpt restore started (exec keeps its pid), never its children, which
  // inherit the environment.
  const auto handoff = restore::handoff_for(getpid());
  if (!handoff) {
    g_state.store(nothing_to_restore, std::memory_order_release);
    return true;
  }
  const bool ok = restore_image(*handoff).ok();
  if (!ok) log::error("restore: the image was not restored; every memory call of this process will fail");
  g_state.store(ok ? restored : failed, std::memory_order_release);
  return ok;
}

}  // namespace

bool restore_ready() noexcept {
  const int s = g_state.load(std::memory_order_acquire);
  if (s == nothing_to_restore || s == restored) return true;
  if (s == failed) return false;
  return restore_slow_path();
}

}  // namespace vmmckpt::detail
