// The program pausing its own GPU memory: vmmckpt_pause() closes the gate, keeps the bytes in host memory (or
// not), and gives the pools' and the program's VMM physical memory back; vmmckpt_resume() makes it again at
// the same addresses, writes the bytes back and opens the gate. No image and no cuda-ckpt: the use is
// lending the GPU to another process for a while (RL loops, sleep modes of inference servers).
#include "self_pause.hpp"

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "context_scope.hpp"
#include "control_server.hpp"
#include "gate.hpp"
#include "pools.hpp"
#include "process_control.hpp"
#include "real_symbols.hpp"
#include "vmm_checkpoint.hpp"
#include "vmmckpt/hex_text.hpp"
#include "vmmckpt/log.hpp"
#include "vmmckpt/restore/pool_restore.hpp"
#include "vmmckpt/vmmckpt.h"

namespace vmmckpt::detail {
namespace {

using clock = std::chrono::steady_clock;

// How long a pause waits for CUDA calls already inside (a synchronize on another thread, say) to return.
constexpr auto quiesce_limit = std::chrono::seconds(60);

#ifdef MADV_POPULATE_WRITE
constexpr int populate_write = MADV_POPULATE_WRITE;
#else
constexpr int populate_write = 23;  // Linux 5.14
#endif

// A range of device memory and, for a pause that keeps the bytes, their copy in host memory.
struct kept_range {
  int device = 0;
  std::uint64_t addr = 0, size = 0;
  void* host = nullptr;  // mmap'd: given back to the system as soon as resume has written it
};

struct pause_state {
  std::mutex mutex;  // one pause or resume at a time
  std::atomic<bool> paused{false};
  bool discard = false;
  std::vector<kept_range> ranges;
};

pause_state& state() {
  static pause_state* s = new pause_state;  // never destroyed: threads may call at exit
  return *s;
}

thread_local std::string t_last_error;

int fail(int code, std::string why) noexcept {
  try {
    t_last_error = std::move(why);
    log::info("{}", t_last_error);  // the caller has it too (vmmckpt_last_error)
  } catch (...) {
    t_last_error.clear();  // out of memory for the message: the code says enough
  }
  return code;
}

void free_host(std::vector<kept_range>& ranges) noexcept {
  for (kept_range& r : ranges)
    if (r.host != nullptr) {
      ::munmap(r.host, r.size);
      r.host = nullptr;
    }
}

// Every range of memory the shim owns and will give back: the pools' live blocks (adjacent ones merged,
// one copy each) and the program's VMM mappings. Throws only for want of memory.
std::vector<kept_range> owned_ranges() {
  std::vector<kept_range> ranges;
  for (const auto& p : active_pools())
    for (const auto& b : p.pool->live_blocks()) {
      if (!ranges.empty() && ranges.back().device == p.ordinal && ranges.back().addr + ranges.back().size == b.addr)
        ranges.back().size += b.size;
      else
        ranges.push_back({p.ordinal, b.addr, b.size, nullptr});
    }
  for (const vmm_mapped_range& m : vmm_mapped_ranges()) ranges.push_back({m.device, m.addr, m.size, nullptr});
  return ranges;
}

// Device to host (keep) before the memory goes. An empty string, or why not (the host copies made so far
// stay for the caller to free).
std::string copy_out(const driver_api& d, std::vector<kept_range>& ranges, std::uint64_t& copied) {
  for (kept_range& r : ranges) {
    void* host = ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (host == MAP_FAILED) return "no host memory for " + std::to_string(r.size) + " bytes: " + std::strerror(errno);
    r.host = host;
    // Huge pages, faulted in before the copy: the driver's pageable copy then runs without a page fault
    // per 4 KiB (both are hints; older kernels ignore them).
    ::madvise(host, r.size, MADV_HUGEPAGE);
    ::madvise(host, r.size, populate_write);
    primary_context_scope scope(d, r.device);
    const CUresult e = scope.active() ? d.cuMemcpyDtoH_v2(host, r.addr, r.size) : CUDA_ERROR_INVALID_CONTEXT;
    if (e != CUDA_SUCCESS)
      return "copying " + std::to_string(r.size) + " bytes at " + hex(r.addr) + " to host memory failed: CUDA error " +
             std::to_string(static_cast<int>(e));
    copied += r.size;
  }
  return {};
}

// Host to device (keep) or zeros (discard) once the memory is back. An empty string, or why not.
std::string copy_in(const driver_api& d, const std::vector<kept_range>& ranges, bool discard, std::uint64_t& copied) {
  for (const kept_range& r : ranges) {
    primary_context_scope scope(d, r.device);
    CUresult e = CUDA_ERROR_INVALID_CONTEXT;
    if (scope.active()) e = discard ? d.cuMemsetD8_v2(r.addr, 0, r.size) : d.cuMemcpyHtoD_v2(r.addr, r.host, r.size);
    if (e == CUDA_SUCCESS && scope.active()) e = d.cuCtxSynchronize();
    if (e != CUDA_SUCCESS)
      return std::string(discard ? "clearing " : "writing back ") + std::to_string(r.size) + " bytes at " + hex(r.addr) +
             " failed: CUDA error " + std::to_string(static_cast<int>(e));
    if (!discard) copied += r.size;
  }
  return {};
}

void give_back_all() noexcept {
  for (const auto& p : active_pools()) {
    try {
      p.pool->release_all_physical();
    } catch (...) {
      log::error("pause: giving back pool memory at {} failed: out of memory", hex(p.pool->base()));
    }
  }
  vmm_release_physical();
}

int pause_self(unsigned flags, vmmckpt_stats* stats) noexcept {
  t_last_error.clear();
  const auto start = clock::now();
  if (flags & ~VMMCKPT_PAUSE_DISCARD) return fail(VMMCKPT_E_INVALID, "vmmckpt_pause: unknown flags " + std::to_string(flags));
  if (!shim_active()) return fail(VMMCKPT_E_STATE, "vmmckpt_pause: the shim stepped aside in this forked child");
  const driver_api* d = driver();
  if (d == nullptr) return fail(VMMCKPT_E_DRIVER, "vmmckpt_pause: no CUDA driver");
  pause_state& s = state();
  std::lock_guard self_lock(s.mutex);
  if (s.paused) return fail(VMMCKPT_E_STATE, "vmmckpt_pause: already paused");
  // cuda-ckpt's operations take the same lock: a pause waits for none of them and never runs inside one.
  std::unique_lock operation(operation_lock(), std::try_to_lock);
  if (!operation.owns_lock())
    return fail(VMMCKPT_E_BUSY, "vmmckpt_pause: cuda-ckpt is dumping, suspending or resuming this process");
  if (is_suspended()) return fail(VMMCKPT_E_STATE, "vmmckpt_pause: the process is suspended by cuda-ckpt");
  if (!the_gate().close(clock::now() + quiesce_limit))
    return fail(VMMCKPT_E_BUSY, "vmmckpt_pause: CUDA calls of other threads did not return within 60 s (or this "
                                "thread is inside one)");
  std::vector<kept_range> ranges;
  std::uint64_t copied = 0, released = 0;
  try {
    for (const auto& p : active_pools()) p.pool->synchronize();
    vmm_synchronize();
    ranges = owned_ranges();
    if (!(flags & VMMCKPT_PAUSE_DISCARD)) {
      if (std::string why = copy_out(*d, ranges, copied); !why.empty()) {
        free_host(ranges);
        the_gate().open();
        return fail(why.rfind("no host memory", 0) == 0 ? VMMCKPT_E_NO_MEMORY : VMMCKPT_E_DRIVER,
                    "vmmckpt_pause: " + why + "; nothing was paused");
      }
    }
    for (const auto& p : active_pools()) released += p.pool->release_all_physical();
    released += vmm_release_physical();
  } catch (const std::exception& e) {
    free_host(ranges);
    the_gate().open();
    return fail(VMMCKPT_E_NO_MEMORY, std::string("vmmckpt_pause: ") + e.what() + "; nothing was paused");
  }
  s.ranges = std::move(ranges);
  s.discard = flags & VMMCKPT_PAUSE_DISCARD;
  s.paused = true;
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  if (stats != nullptr) *stats = {released, copied, seconds};
  log::info("pause: {} bytes of GPU memory given back, {} bytes kept in host memory, in {:.3f} s", released, copied,
            seconds);
  // The gate stays closed: CUDA calls wait for resume.
  return VMMCKPT_OK;
}

int resume_self(vmmckpt_stats* stats) noexcept {
  t_last_error.clear();
  const auto start = clock::now();
  const driver_api* d = driver();
  pause_state& s = state();
  std::lock_guard self_lock(s.mutex);
  if (!s.paused) return fail(VMMCKPT_E_STATE, "vmmckpt_resume: not paused");
  if (d == nullptr) return fail(VMMCKPT_E_DRIVER, "vmmckpt_resume: no CUDA driver");
  // A cuda-ckpt operation that started while paused is refused and lets go at once; none may see the
  // gate open before the state says running.
  std::lock_guard operation(operation_lock());
  std::uint64_t made = 0, copied = 0;
  std::vector<device_pool*> backed;
  for (const auto& p : active_pools()) {
    int backend_error = 0;
    if (p.pool->rebuild_physical(&backend_error) != pool_status::ok) {
      restore::release_pools(backed);
      return fail(VMMCKPT_E_NO_MEMORY, "vmmckpt_resume: no GPU memory to back the pool of device " +
                                           std::to_string(p.ordinal) + " (error " + std::to_string(backend_error) +
                                           "); still paused, try again");
    }
    backed.push_back(p.pool);
    made += p.pool->stats().backed_bytes;
  }
  if (const status vmm = vmm_back_released(); !vmm.ok()) {
    restore::release_pools(backed);
    return fail(VMMCKPT_E_NO_MEMORY, "vmmckpt_resume: " + vmm.message() + "; still paused, try again");
  }
  for (const kept_range& r : s.ranges)
    if (pool_containing(r.addr) == nullptr) made += r.size;  // VMM mappings
  if (std::string why = copy_in(*d, s.ranges, s.discard, copied); !why.empty()) {
    give_back_all();
    return fail(VMMCKPT_E_DRIVER, "vmmckpt_resume: " + why + "; still paused, try again");
  }
  free_host(s.ranges);
  s.ranges.clear();
  s.paused = false;
  the_gate().open();
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  if (stats != nullptr) *stats = {made, copied, seconds};
  log::info("resume: {} bytes of GPU memory back, {} bytes written back, in {:.3f} s", made, copied, seconds);
  return VMMCKPT_OK;
}

}  // namespace

bool is_self_paused() noexcept { return state().paused.load(); }

}  // namespace vmmckpt::detail

extern "C" {

__attribute__((visibility("default"))) int vmmckpt_pause(unsigned flags, vmmckpt_stats* stats) {
  return vmmckpt::detail::pause_self(flags, stats);
}

__attribute__((visibility("default"))) int vmmckpt_resume(vmmckpt_stats* stats) {
  return vmmckpt::detail::resume_self(stats);
}

__attribute__((visibility("default"))) int vmmckpt_state(void) {
  if (vmmckpt::detail::is_self_paused()) return 1;
  return vmmckpt::detail::is_suspended() ? 2 : 0;
}

__attribute__((visibility("default"))) const char* vmmckpt_last_error(void) {
  return vmmckpt::detail::t_last_error.c_str();
}

__attribute__((visibility("default"))) int vmmckpt_api_version(void) { return VMMCKPT_API_VERSION; }

}  // extern "C"
