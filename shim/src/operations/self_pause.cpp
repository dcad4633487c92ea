// The program pausing its own GPU memory: vmmckpt_pause() closes the gate, keeps the bytes in host memory (or
// not), and gives the pools' and the program's VMM physical memory back; vmmckpt_resume() makes it again at
// the same addresses, writes the bytes back and opens the gate. No image and no cuda-ckpt: the use is
// lending the GPU to another process for a while (RL loops, sleep modes of inference servers).
#include "memory/vmm_sharing.hpp"

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/context_scope.hpp"
#include "memory/ipc_exports.hpp"
#include "memory/memory_tags.hpp"
#include "memory/named_ranges.hpp"
#include "operations/operations.hpp"
#include "core/gate.hpp"
#include "memory/pools.hpp"
#include "operations/process_control.hpp"
#include "core/real_symbols.hpp"
#include "memory/vmm_checkpoint.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/log.hpp"
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

// A range of device memory and, for one whose bytes the pause keeps, their copy in host memory.
struct kept_range {
  int device = 0;
  std::uint64_t addr = 0, size = 0;
  void* host = nullptr;  // mmap'd: given back to the system as soon as resume has written it
  bool discard = false;  // its bytes dropped: resume clears it
};

// What a pause does with each range's bytes: its tag's policy (vmmckpt_pause_tagged), else the default.
struct pause_policy {
  bool discard = false;
  std::map<std::string, bool> discard_by_tag;
  bool discards(const std::string& tag) const {
    const auto found = tag.empty() ? discard_by_tag.end() : discard_by_tag.find(tag);
    return found != discard_by_tag.end() ? found->second : discard;
  }
};

// What a pause kept for its resume (whether the process is paused is operations.hpp's process_state).
struct pause_record {
  std::mutex mutex;  // one pause or resume at a time
  std::vector<kept_range> ranges;
};

pause_record& the_pause() {
  static pause_record* s = new pause_record;  // never destroyed: threads may call at exit
  return *s;
}

// A plain array: nothing to destroy at thread exit, so a call from an atexit handler or a static
// destructor still finds it.
thread_local char t_last_error[512];

void set_last_error(const char* why) noexcept {
  std::strncpy(t_last_error, why, sizeof t_last_error - 1);
  t_last_error[sizeof t_last_error - 1] = '\0';
}

int fail(int code, const std::string& why) noexcept {
  set_last_error(why.c_str());
  log::info("{}", why);  // the caller has it too (vmmckpt_last_error)
  return code;
}

void free_host(std::vector<kept_range>& ranges) noexcept {
  for (kept_range& r : ranges)
    if (r.host != nullptr) {
      ::munmap(r.host, r.size);
      r.host = nullptr;
    }
}

// Every range of memory the shim owns and will give back, each marked as `policy` says for its tag: the pools'
// live blocks (adjacent ones of one policy merged, one copy each) and the program's VMM mappings. Throws only
// for want of memory.
std::vector<kept_range> owned_ranges(const pause_policy& policy) {
  const bool tagged = any_memory_tagged.load(std::memory_order_relaxed);
  std::vector<kept_range> ranges;
  for (const auto& p : active_pools())
    for (const auto& b : p.pool->live_blocks()) {
      const bool discard = policy.discards(tagged ? tag_of(tagged_kind::pool_block, b.addr) : std::string());
      if (!ranges.empty() && ranges.back().device == p.ordinal && ranges.back().addr + ranges.back().size == b.addr &&
          ranges.back().discard == discard)
        ranges.back().size += b.size;
      else
        ranges.push_back({p.ordinal, b.addr, b.size, nullptr, discard});
    }
  for (const vmm_mapped_range& m : vmm_mapped_ranges())
    ranges.push_back({m.device, m.addr, m.size, nullptr,
                      policy.discards(tagged ? tag_of(tagged_kind::vmm_handle, m.token) : std::string())});
  return ranges;
}

// Device to host (keep) before the memory goes. An empty string, or why not (the host copies made so far
// stay for the caller to free).
std::string copy_out(const driver_api& d, std::vector<kept_range>& ranges, std::uint64_t& copied) {
  for (kept_range& r : ranges) {
    if (r.discard) continue;
    // Accounted (no MAP_NORESERVE): memory the system cannot give is refused here, not by the OOM killer
    // during the copy.
    void* host = ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) return "no host memory for " + std::to_string(r.size) + " bytes: " + std::strerror(errno);
    r.host = host;
    // Huge pages, faulted in before the copy: the driver's pageable copy then runs without a page fault
    // per 4 KiB. Kernels before 5.14 lack the populate (EINVAL): the copy faults the pages in itself.
    ::madvise(host, r.size, MADV_HUGEPAGE);
    if (::madvise(host, r.size, populate_write) != 0 && errno == ENOMEM)
      return "no host memory for " + std::to_string(r.size) + " bytes";
    primary_context_scope scope(d, r.device);
    const CUresult e = scope.active() ? d.cuMemcpyDtoH_v2(host, r.addr, r.size) : CUDA_ERROR_INVALID_CONTEXT;
    if (e != CUDA_SUCCESS)
      return "copying " + std::to_string(r.size) + " bytes at " + hex(r.addr) + " to host memory failed: CUDA error " +
             std::to_string(static_cast<int>(e));
    copied += r.size;
  }
  return {};
}

// Host to device (kept) or zeros (discarded) once the memory is back. An empty string, or why not.
std::string copy_in(const driver_api& d, const std::vector<kept_range>& ranges, std::uint64_t& copied) {
  for (const kept_range& r : ranges) {
    primary_context_scope scope(d, r.device);
    CUresult e = CUDA_ERROR_INVALID_CONTEXT;
    if (scope.active()) e = r.discard ? d.cuMemsetD8_v2(r.addr, 0, r.size) : d.cuMemcpyHtoD_v2(r.addr, r.host, r.size);
    if (e == CUDA_SUCCESS && scope.active()) e = d.cuCtxSynchronize();
    if (e != CUDA_SUCCESS)
      return std::string(r.discard ? "clearing " : "writing back ") + std::to_string(r.size) + " bytes at " +
             hex(r.addr) + " failed: CUDA error " + std::to_string(static_cast<int>(e));
    if (!r.discard) copied += r.size;
  }
  return {};
}

// Every pool's and the program's VMM physical memory given back; the bytes freed. What cannot be given
// back for want of host memory stays mapped, and is logged.
std::uint64_t give_back_all(const std::vector<active_pool>& pools) noexcept {
  std::uint64_t released = 0;
  for (const auto& p : pools) {
    try {
      released += p.pool->release_all_physical();
    } catch (...) {
      log::error("pause: giving back pool memory at {} failed: out of memory", hex(p.pool->base()));
    }
  }
  return released + vmm_release_physical();
}

// Throws only for want of memory before the gate closes or after it opened again (the exported function
// catches it); from the gate's closing to the pause's end nothing that throws escapes.
int pause_self(const pause_policy& policy, vmmckpt_stats* stats) {
  const auto start = clock::now();
  if (!shim_active()) return fail(VMMCKPT_E_STATE, "vmmckpt_pause: the shim stepped aside in this forked child");
  const driver_api* d = driver();
  if (d == nullptr) return fail(VMMCKPT_E_DRIVER, "vmmckpt_pause: no CUDA driver");
  pause_record& s = the_pause();
  std::lock_guard self_lock(s.mutex);
  if (current_state() == process_state::paused) return fail(VMMCKPT_E_STATE, "vmmckpt_pause: already paused");
  // cuda-ckpt's operations take the same lock: a pause waits for none of them and never runs inside one.
  std::unique_lock operation(operation_lock(), std::try_to_lock);
  if (!operation.owns_lock())
    return fail(VMMCKPT_E_BUSY, "vmmckpt_pause: cuda-ckpt is dumping, suspending or resuming this process");
  if (current_state() != process_state::running)
    return fail(VMMCKPT_E_STATE, "vmmckpt_pause: the process is suspended by cuda-ckpt");
  if (!live_importers().empty())
    return fail(VMMCKPT_E_STATE, "vmmckpt_pause: other processes map this process's memory through CUDA IPC");
  if (!vmm_importers().empty())
    return fail(VMMCKPT_E_STATE, "vmmckpt_pause: other processes map this process's VMM memory (imported POSIX FDs)");
  if (!the_gate().close(clock::now() + quiesce_limit))
    return fail(VMMCKPT_E_BUSY, "vmmckpt_pause: CUDA calls of other threads did not return within 60 s (or this "
                                "thread is inside one)");
  std::vector<kept_range> ranges;
  std::vector<active_pool> pools;
  std::uint64_t copied = 0;
  std::string why;
  try {
    pools = active_pools();
    for (const auto& p : pools) p.pool->synchronize();
    vmm_synchronize();
    ranges = owned_ranges(policy);
    why = copy_out(*d, ranges, copied);
  } catch (const std::exception& e) {
    why = e.what();  // out of memory: std::string's small buffer holds what bad_alloc says
  }
  if (!why.empty()) {
    free_host(ranges);
    the_gate().open();
    return fail(why.rfind("copying", 0) == 0 ? VMMCKPT_E_DRIVER : VMMCKPT_E_NO_MEMORY,
                "vmmckpt_pause: " + why + "; nothing was paused");
  }
  // The bytes are safe: from here the pause completes.
  const std::uint64_t released = give_back_all(pools);
  s.ranges = std::move(ranges);
  enter_state(process_state::paused);
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  if (stats != nullptr) *stats = {released, copied, seconds};
  log::info("pause: {} bytes of GPU memory given back, {} bytes kept in host memory, in {:.3f} s", released, copied,
            seconds);
  // The gate stays closed: CUDA calls wait for resume.
  return VMMCKPT_OK;
}

// Throws only for want of memory, the process then still paused with nothing made (the exported function
// catches it).
int resume_self(vmmckpt_stats* stats) {
  const auto start = clock::now();
  if (!shim_active()) return fail(VMMCKPT_E_STATE, "vmmckpt_resume: the shim stepped aside in this forked child");
  const driver_api* d = driver();
  pause_record& s = the_pause();
  std::lock_guard self_lock(s.mutex);
  if (current_state() != process_state::paused) return fail(VMMCKPT_E_STATE, "vmmckpt_resume: not paused");
  if (d == nullptr) return fail(VMMCKPT_E_DRIVER, "vmmckpt_resume: no CUDA driver");
  // A cuda-ckpt operation that started while paused is refused and lets go at once; none may see the
  // gate open before the state says running.
  std::lock_guard operation(operation_lock());
  std::uint64_t made = 0, copied = 0;
  const std::vector<active_pool> pools = active_pools();
  std::vector<device_pool*> backed;
  backed.reserve(pools.size());  // push_back below cannot throw once memory is made
  for (const auto& p : pools) {
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
  std::string why;
  try {
    why = copy_in(*d, s.ranges, copied);
  } catch (...) {
    why = "no memory";  // for the message: fits std::string's own buffer
  }
  if (!why.empty()) {
    give_back_all(pools);
    return fail(VMMCKPT_E_DRIVER, "vmmckpt_resume: " + why + "; still paused, try again");
  }
  free_host(s.ranges);
  s.ranges.clear();
  enter_state(process_state::running);
  the_gate().open();
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  if (stats != nullptr) *stats = {made, copied, seconds};
  log::info("resume: {} bytes of GPU memory back, {} bytes written back, in {:.3f} s", made, copied, seconds);
  return VMMCKPT_OK;
}

}  // namespace

}  // namespace vmmckpt::detail

extern "C" {

__attribute__((visibility("default"))) int vmmckpt_pause(unsigned flags, vmmckpt_stats* stats) {
  return vmmckpt_pause_tagged(flags, nullptr, 0, stats);
}

__attribute__((visibility("default"))) int vmmckpt_pause_tagged(unsigned flags, const vmmckpt_tag_policy* policies,
                                                                unsigned count, vmmckpt_stats* stats) {
  using vmmckpt::detail::fail;
  vmmckpt::detail::set_last_error("");
  try {
    vmmckpt::detail::pause_policy policy;
    if (flags & ~VMMCKPT_PAUSE_DISCARD)
      return fail(VMMCKPT_E_INVALID, "vmmckpt_pause: unknown flags " + std::to_string(flags));
    policy.discard = flags & VMMCKPT_PAUSE_DISCARD;
    if (count != 0 && policies == nullptr) return fail(VMMCKPT_E_INVALID, "vmmckpt_pause_tagged: no policies");
    for (unsigned i = 0; i < count; ++i) {
      if (policies[i].tag == nullptr || *policies[i].tag == '\0' || (policies[i].flags & ~VMMCKPT_PAUSE_DISCARD))
        return fail(VMMCKPT_E_INVALID,
                    "vmmckpt_pause_tagged: policy " + std::to_string(i) + " has no tag or unknown flags");
      policy.discard_by_tag[policies[i].tag] = policies[i].flags & VMMCKPT_PAUSE_DISCARD;
    }
    return vmmckpt::detail::pause_self(policy, stats);
  } catch (...) {
    vmmckpt::detail::set_last_error("vmmckpt_pause: out of host memory; nothing was paused");
    return VMMCKPT_E_NO_MEMORY;
  }
}

__attribute__((visibility("default"))) int vmmckpt_set_tag(const char* tag) {
  vmmckpt::detail::set_last_error("");
  try {
    const std::string why = vmmckpt::detail::set_thread_tag(tag != nullptr ? tag : "");
    if (why.empty()) return VMMCKPT_OK;
    vmmckpt::detail::set_last_error(("vmmckpt_set_tag: " + why).c_str());
  } catch (...) {
    vmmckpt::detail::set_last_error("vmmckpt_set_tag: out of host memory");
  }
  return VMMCKPT_E_INVALID;
}

__attribute__((visibility("default"))) int vmmckpt_resume(vmmckpt_stats* stats) {
  vmmckpt::detail::set_last_error("");
  try {
    return vmmckpt::detail::resume_self(stats);
  } catch (...) {
    vmmckpt::detail::set_last_error("vmmckpt_resume: out of host memory; still paused, try again");
    return VMMCKPT_E_NO_MEMORY;
  }
}

__attribute__((visibility("default"))) int vmmckpt_state(void) {
  using vmmckpt::detail::process_state;
  switch (vmmckpt::detail::current_state()) {
    case process_state::paused: return 1;
    case process_state::suspended:
    case process_state::restoring: return 2;
    case process_state::running:
    case process_state::holding: break;
  }
  return 0;
}

__attribute__((visibility("default"))) const char* vmmckpt_last_error(void) { return vmmckpt::detail::t_last_error; }

__attribute__((visibility("default"))) int vmmckpt_name(const void* ptr, uint64_t size, const char* name) {
  vmmckpt::detail::set_last_error("");
  try {
    if (name == nullptr) throw std::invalid_argument("no name");
    const std::string why =
        vmmckpt::detail::name_range(name, reinterpret_cast<std::uintptr_t>(ptr), static_cast<std::uint64_t>(size));
    if (why.empty()) return VMMCKPT_OK;
    vmmckpt::detail::set_last_error(("vmmckpt_name: " + why).c_str());
  } catch (...) {
    vmmckpt::detail::set_last_error("vmmckpt_name: no name given, or out of host memory");
  }
  return VMMCKPT_E_INVALID;
}

__attribute__((visibility("default"))) int vmmckpt_api_version(void) { return VMMCKPT_API_VERSION; }

}  // extern "C"
