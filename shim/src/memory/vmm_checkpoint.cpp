// Program-made VMM memory in checkpoints: described, handed over, given back, rebuilt.
#include "memory/vmm_checkpoint.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "core/context_scope.hpp"
#include "memory/vmm_sharing.hpp"
#include "core/real_symbols.hpp"
#include "memory/pools.hpp"
#include "memory/vmm_state.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/support/hex_text.hpp"

namespace vmmckpt::detail {
namespace {

int window_of(const vmm_config& c, std::uint64_t addr) { return static_cast<int>((addr - c.base) / c.window); }

// The access rights the registry records over [addr, addr + size) given again (a mapping made anew). An empty
// status, or the failing call's error.
status set_recorded_access(const driver_api& d, const vmm_state& s, std::uint64_t addr, std::uint64_t size) {
  for (const vmm_access_range& a : s.registry.access_over(addr, size)) {
    std::vector<CUmemAccessDesc> desc;
    for (const vmm_access& v : a.access) {
      CUmemAccessDesc one{};
      one.location.type = static_cast<CUmemLocationType>(v.location_type);
      one.location.id = v.location_id;
      one.flags = static_cast<CUmemAccess_flags>(v.flags);
      desc.push_back(one);
    }
    if (const CUresult e = d.cuMemSetAccess(a.addr, a.size, desc.data(), desc.size()); e != CUDA_SUCCESS)
      return failure(e, "cannot give access to VMM memory at {}: CUDA error {}", hex(a.addr), static_cast<int>(e));
  }
  return {};
}

// Every owned mapping of device memory unmapped and its real handle released; the records stay (real 0).
// Host-located memory stays as it is (host_located()).
std::uint64_t release_locked(const driver_api& d, vmm_state& s) {
  for (const vmm_mapping& m : s.registry.mappings()) {
    const vmm_handle* h = s.registry.find_handle(m.token);
    if (h == nullptr || h->real == 0 || host_located(*h)) continue;
    if (const CUresult e = d.cuMemUnmap(m.addr, m.size); e != CUDA_SUCCESS)
      log::warn("suspend: cuMemUnmap of VMM memory at {} failed: CUDA error {}", hex(m.addr), static_cast<int>(e));
  }
  std::uint64_t bytes = 0;
  for (const auto& [token, real] : s.registry.take_real(host_located)) {
    if (const vmm_handle* h = s.registry.find_handle(token)) bytes += h->size;
    if (const CUresult e = d.cuMemRelease(real); e != CUDA_SUCCESS)
      log::warn("suspend: cuMemRelease of VMM handle {} failed: CUDA error {}", hex(token), static_cast<int>(e));
  }
  return bytes;
}

// The driver's memory again under every token the registry holds, mapped and with its access rights. On
// failure what was made is given back (the records stay without memory).
status rebuild_locked(const driver_api& d, vmm_state& s) noexcept {
  auto undo = [&] {
    try {
      release_locked(d, s);
    } catch (...) {
      log::error("giving back VMM memory after a failed rebuild: out of memory");
    }
  };
  try {
    const vmm_layout l = s.registry.layout();
    std::vector<std::uint64_t> made;  // tokens given memory here; the others kept theirs (host memory)
    for (const vmm_handle& h : l.handles) {
      if (const vmm_handle* live = s.registry.find_handle(h.token); live != nullptr && live->real != 0) continue;
      CUmemAllocationProp prop = program_properties(h);
      prop.requestedHandleTypes =
          static_cast<CUmemAllocationHandleType>(prop.requestedHandleTypes | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      CUmemGenericAllocationHandle real = 0;
      if (const CUresult e = d.cuMemCreate(&real, h.size, &prop, h.flags); e != CUDA_SUCCESS) {
        undo();
        return failure(e, "cannot create VMM memory for handle {} ({} bytes on device {}): CUDA error {}", hex(h.token),
                       h.size, h.device, static_cast<int>(e));
      }
      s.registry.replace_real(h.token, real);
      made.push_back(h.token);
    }
    for (const vmm_mapping& m : l.mappings) {
      if (!std::binary_search(made.begin(), made.end(), m.token)) continue;  // still mapped
      const vmm_handle* h = s.registry.find_handle(m.token);
      if (const CUresult e = d.cuMemMap(m.addr, m.size, m.offset, h->real, 0); e != CUDA_SUCCESS) {
        undo();
        return failure(e, "cannot map VMM handle {} at {}: CUDA error {}", hex(m.token), hex(m.addr),
                       static_cast<int>(e));
      }
      // Over this mapping only: the access records also cover other processes' memory, mapped apart.
      if (status given = set_recorded_access(d, s, m.addr, m.size); !given.ok()) {
        undo();
        return given;
      }
    }
    return {};
  } catch (const std::exception& e) {
    undo();
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "rebuilding VMM memory: {}", e.what());
  }
}

// A restore: each import mapped again from its exporter, where it still runs under the shim. One that cannot
// be is left unmapped, with a warning naming it: the program finds the range reserved and empty, as after a
// legacy IPC handle it must open again (docs/vmm.md).
void map_imports_again(const driver_api& d, vmm_state& s, const std::vector<vmm_import>& imports) {
  for (const vmm_import& x : imports) {
    CUmemGenericAllocationHandle real = 0;
    status mapped = import_again(x, real, {});
    bool in_place = false;
    if (mapped.ok()) {
      if (const CUresult e = d.cuMemMap(x.addr, x.size, x.offset, real, 0); e != CUDA_SUCCESS)
        mapped = status(e, "mapping it failed: CUDA error " + std::to_string(e));
      else
        in_place = true;
    }
    if (mapped.ok()) mapped = set_recorded_access(d, s, x.addr, x.size);
    if (mapped.ok()) {
      const std::uint64_t token = s.registry.add_import(real, x);  // the one reference, as the program's import had
      s.registry.map(x.addr, x.size, x.offset, token);
      log::info("restore: {} bytes of process {}'s VMM handle {} mapped again at {}", x.size, x.exporter_pid,
                hex(x.token), hex(x.addr));
      continue;
    }
    if (in_place) d.cuMemUnmap(x.addr, x.size);
    if (real != 0) d.cuMemRelease(real);
    std::vector<std::uint64_t> none;
    s.registry.unmap(x.addr, x.size, none);  // its access rights go with it
    log::warn("restore: process {}'s VMM memory that the image maps at {} ({} bytes) is not mapped again: {}",
              x.exporter_pid, hex(x.addr), x.size, mapped.message());
  }
}

// Maps one import given back by a job's suspend again (`real`, imported anew from its exporter), with its access
// rights and as many driver references as the program holds. What fails is given back, and says why.
status map_import_again(const driver_api& d, vmm_state& s, const vmm_registry::held_import& x,
                        CUmemGenericAllocationHandle real) {
  std::size_t mapped = 0;
  auto undo = [&](status why) {
    for (std::size_t i = 0; i < mapped; ++i) d.cuMemUnmap(x.mappings[i].addr, x.mappings[i].size);
    d.cuMemRelease(real);
    return why;
  };
  for (const vmm_mapping& m : x.mappings) {
    if (const CUresult e = d.cuMemMap(m.addr, m.size, m.offset, real, 0); e != CUDA_SUCCESS)
      return undo(failure(e, "mapping it at {} failed: CUDA error {}", hex(m.addr), static_cast<int>(e)));
    ++mapped;
    if (status given = set_recorded_access(d, s, m.addr, m.size); !given.ok()) return undo(given);
  }
  // The import holds one reference; the program holds x.refs (it may have released its own after mapping).
  for (std::uint32_t i = 1; i < x.refs && !x.mappings.empty(); ++i) {
    CUmemGenericAllocationHandle again = 0;
    d.cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(x.mappings.front().addr));
  }
  if (x.refs == 0) d.cuMemRelease(real);
  s.registry.set_import_real(x.token, real, suspend_claim::start_time(static_cast<pid_t>(x.origin.exporter_pid)));
  return {};
}

}  // namespace

std::uint64_t vmm_drop_imports() noexcept {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr || d == nullptr) return 0;
  try {
    std::lock_guard lock(s->mutex);
    std::uint64_t bytes = 0;
    for (const auto& x : s->registry.identified_imports()) {
      if (x.real == 0) continue;
      for (const vmm_mapping& m : x.mappings) {
        if (const CUresult e = d->cuMemUnmap(m.addr, m.size); e != CUDA_SUCCESS)
          log::warn("suspend: unmapping process {}'s memory at {} failed: CUDA error {}", x.origin.exporter_pid,
                    hex(m.addr), static_cast<int>(e));
        bytes += m.size;
      }
      for (std::uint32_t i = 0; i < x.refs; ++i) d->cuMemRelease(x.real);
      s->registry.set_import_real(x.token, 0);
    }
    return bytes;
  } catch (...) {
    return 0;  // no memory to list them: they stay mapped (the exporter's memory is then not all freed)
  }
}

status vmm_map_imports_again(const std::vector<std::int64_t>& job_ranks) noexcept {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr) return {};
  if (d == nullptr) return failure(CUDA_ERROR_NOT_INITIALIZED, "no CUDA driver");
  try {
    std::vector<vmm_registry::held_import> imports;
    {
      std::lock_guard lock(s->mutex);
      imports = s->registry.identified_imports();
    }
    for (const auto& x : imports) {
      if (x.real != 0) continue;
      auto said = [&](const status& why) {
        return failure(why.code(), "process {}'s memory that this one maps at {} ({} bytes): {}", x.origin.exporter_pid,
                       x.mappings.empty() ? std::string("nowhere") : hex(x.mappings.front().addr), x.origin.handle_size,
                       why.message());
      };
      // Asked without the registry's lock: the exporter may be asking this process the same meanwhile.
      CUmemGenericAllocationHandle real = 0;
      if (status got = import_again(x.origin, real, job_ranks); !got.ok()) return said(got);
      std::lock_guard lock(s->mutex);
      if (status mapped = map_import_again(*d, *s, x, real); !mapped.ok()) return said(mapped);
    }
    return {};
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "mapping the job's memory again: {}", e.what());
  }
}

std::vector<control::pool_summary> vmm_summaries() {
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return {};
  std::lock_guard lock(s->mutex);
  std::map<int, control::pool_summary> by_window;
  auto summary = [&](int device) -> control::pool_summary& {
    auto [it, added] = by_window.try_emplace(device);
    if (added) {
      it->second.device = device;
      it->second.base = s->config.device_base(device);
      it->second.size = s->config.window;
      it->second.vmm = true;
    }
    return it->second;
  };
  for (const vmm_reservation& r : s->registry.reservations()) summary(r.device);
  for (const vmm_mapping& m : s->registry.mappings()) {
    control::pool_summary& p = summary(window_of(s->config, m.addr));
    p.live_bytes += m.size;
    ++p.live_count;
  }
  for (const vmm_handle& h : s->registry.handles())
    if (auto it = by_window.find(h.device); it != by_window.end()) it->second.backed_bytes += h.size;
  std::vector<control::pool_summary> out;
  out.reserve(by_window.size());
  for (auto& [device, p] : by_window) out.push_back(p);
  return out;
}

void vmm_synchronize() noexcept {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr || d == nullptr) return;
  bool has_window[max_devices] = {};
  try {
    std::lock_guard lock(s->mutex);
    for (const vmm_reservation& r : s->registry.reservations()) has_window[r.device] = true;
  } catch (...) {
    return;  // out of memory: these devices are not waited for (the pools still are)
  }
  for (int ordinal = 0; ordinal < max_devices; ++ordinal) {
    if (!has_window[ordinal]) continue;
    primary_context_scope scope(*d, ordinal);
    if (scope.active()) d->cuCtxSynchronize();
  }
}

std::size_t vmm_handle_count() {
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return 0;
  std::lock_guard lock(s->mutex);
  return s->registry.handle_count();
}

std::string vmm_hold_contents(control::dump_begin_reply& r, std::vector<int>& fds) {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr || d == nullptr) return {};
  std::lock_guard lock(s->mutex);
  vmm_layout l = s->registry.layout();
  if (l.empty()) return {};
  std::map<int, control::pool_contents> by_window;
  for (const vmm_reservation& res : l.reservations) {
    auto [it, added] = by_window.try_emplace(res.device);
    if (added) {
      it->second.device = res.device;
      it->second.base = s->config.device_base(res.device);
      it->second.size = s->config.window;
      it->second.granularity = vmm_granularity;
      it->second.vmm = true;
    }
  }
  for (const vmm_mapping& m : l.mappings) {
    control::pool_contents& p = by_window.at(window_of(s->config, m.addr));
    p.allocations.push_back({m.addr, m.size, alloc_api::cu_mem_map});
  }
  fds.reserve(fds.size() + l.handles.size());  // no push_back below may throw with an exported fd in hand
  for (const vmm_handle& h : l.handles) {
    const vmm_handle* live = s->registry.find_handle(h.token);
    int fd = -1;
    const CUresult e = d->cuMemExportToShareableHandle(&fd, live->real, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (e != CUDA_SUCCESS)
      return "exporting VMM handle " + hex(h.token) + " failed: CUDA error " + std::to_string(static_cast<int>(e));
    fds.push_back(fd);
  }
  for (auto& [device, p] : by_window) {
    p.allocation_count = p.allocations.size();
    r.pools.push_back(std::move(p));
  }
  r.vmm = std::move(l);
  return {};
}

std::uint64_t vmm_release_physical() noexcept {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr || d == nullptr) return 0;
  try {
    std::lock_guard lock(s->mutex);
    return release_locked(*d, *s);
  } catch (...) {
    return 0;  // the layout could not be listed (no memory): the memory stays mapped
  }
}

status vmm_back_suspended(const image::manifest& m) noexcept {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr) {
    if (m.vmm && !m.vmm->empty())
      return failure(CUDA_ERROR_INVALID_VALUE, "the image's VMM memory is not this program's");
    return {};
  }
  if (d == nullptr) return failure(CUDA_ERROR_NOT_INITIALIZED, "no CUDA driver");
  try {
    std::lock_guard lock(s->mutex);
    const vmm_layout mine = s->registry.layout();
    if (!(m.vmm ? *m.vmm == mine : mine.empty()))
      return failure(CUDA_ERROR_INVALID_VALUE, "the image's VMM memory is not the suspended program's");
    return rebuild_locked(*d, *s);
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "resume of VMM memory: {}", e.what());
  }
}

std::vector<vmm_mapped_range> vmm_mapped_ranges() {
  std::vector<vmm_mapped_range> ranges;
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return ranges;
  std::lock_guard lock(s->mutex);
  for (const vmm_mapping& m : s->registry.mappings())
    if (const vmm_handle* h = s->registry.find_handle(m.token); h != nullptr && !host_located(*h))
      ranges.push_back({h->device, m.addr, m.size, m.token});  // host memory stays mapped: release_locked()
  return ranges;
}

std::string vmm_export_range(std::uint64_t addr, std::uint64_t size, control::peek_piece& piece, int& fd) {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr || d == nullptr) return "map: " + hex(addr) + " is in no VMM mapping of this program";
  std::lock_guard lock(s->mutex);
  const auto m = s->registry.mapping_at(addr);
  if (!m || size > m->size - (addr - m->addr))
    return "map: the range at " + hex(addr) + " is not inside one VMM mapping of this program";
  const vmm_handle* h = s->registry.find_handle(m->token);
  if (h == nullptr) return "map: the mapping at " + hex(m->addr) + " has no handle";
  if (const CUresult e = d->cuMemExportToShareableHandle(&fd, h->real, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      e != CUDA_SUCCESS)
    return "exporting VMM handle " + hex(h->token) + " failed: CUDA error " + std::to_string(static_cast<int>(e));
  piece = {addr, size, m->offset + (addr - m->addr), h->size};
  return {};
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> vmm_kept_ranges() {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return ranges;
  std::lock_guard lock(s->mutex);
  for (const vmm_mapping& m : s->registry.mappings())
    if (const vmm_handle* h = s->registry.find_handle(m.token); h != nullptr && host_located(*h))
      ranges.emplace_back(m.addr, m.size);
  return ranges;
}

status vmm_back_released() noexcept {
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return {};
  const driver_api* d = driver();
  if (d == nullptr) return failure(CUDA_ERROR_NOT_INITIALIZED, "no CUDA driver");
  std::lock_guard lock(s->mutex);
  return rebuild_locked(*d, *s);
}

status vmm_restore_layout(const image::manifest& m) noexcept {
  if (!m.vmm || m.vmm->empty()) return {};
  const driver_api* d = driver();
  if (d == nullptr) return failure(CUDA_ERROR_NOT_INITIALIZED, "no CUDA driver");
  try {
    vmm_state& s = vmm_state_for_recording();
    std::lock_guard lock(s.mutex);
    const vmm_layout& l = *m.vmm;
    if (!s.config_error.empty()) return failure(CUDA_ERROR_INVALID_VALUE, "restore: {}", s.config_error);
    // The reservations are carved out of the windows, as the program's own are: only the windows are the
    // driver's to reserve.
    for (const vmm_reservation& r : l.reservations)
      if (const status reserved = reserve_windows(s, r.device); !reserved.ok())
        return failure(reserved.code(), "restore: {} at {} in this process", reserved.message(),
                       hex(s.config.device_base(r.device)));
    if (!s.registry.load(l))
      return failure(
          CUDA_ERROR_INVALID_VALUE,
          "restore: the image's VMM windows (base {}, window {}) are not this process's (base {}, window {})",
          hex(l.windows.base), l.windows.window, hex(s.config.base), s.config.window);
    map_imports_again(*d, s, l.imports);
    return rebuild_locked(*d, s);
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "restore of VMM memory: {}", e.what());
  }
}

namespace {

// What a --replay restore still has to write back: the image's mappings, and the image to read them from.
struct replay_state {
  image::reader reader;
  std::vector<vmm_mapping> pending;  // address order
  std::uint64_t filled_bytes = 0;
};
// Set before the program's first VMM call, read under vmm_state's mutex after; never destroyed at exit
// (threads may call at exit), deleted once every mapping is back.
replay_state* g_replay = nullptr;

// Writes [m.addr, + m.size) from the image through the real driver, in the primary context of `device`.
status fill_mapping(const driver_api& d, const image::reader& reader, const vmm_mapping& m, int device) {
  primary_context_scope scope(d, device);
  if (!scope.active()) return failure(CUDA_ERROR_INVALID_CONTEXT, "no context on device {}", device);
  CUresult copied = CUDA_SUCCESS;
  std::uint64_t at = m.addr;
  try {
    reader.read_range(m.addr, m.size, [&](const unsigned char* bytes, std::size_t n) {
      if (copied == CUDA_SUCCESS) copied = d.cuMemcpyHtoD_v2(at, bytes, n);
      at += n;
    });
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_INVALID_VALUE, "cannot read the image's bytes for {}: {}", hex(m.addr), e.what());
  }
  if (copied != CUDA_SUCCESS)
    return failure(copied, "cannot write the image's bytes at {}: CUDA error {}", hex(m.addr),
                   static_cast<int>(copied));
  return {};
}

// Every extent of the image's pools of kind vmm read and its checksum checked: a --replay restore refuses
// a damaged image before the program starts, as the pools' upload does, rather than fill part of it.
void verify_vmm_extents(const image::reader& reader) {
  std::vector<unsigned char> buffer;
  for (const image::pool& p : reader.info().pools) {
    if (p.kind != image::pool_kind::vmm) continue;
    for (const image::extent& e : p.extents) {
      buffer.resize(e.stored);
      reader.read(e, buffer.data());
    }
  }
}

}  // namespace

status vmm_prepare_replay(const std::string& image, const image::manifest& m) noexcept {
  if (!m.vmm || m.vmm->mappings.empty()) return {};
  try {
    auto replay = std::make_unique<replay_state>(replay_state{image::reader::open(image), m.vmm->mappings, 0});
    replay->reader.verify_manifest();
    verify_vmm_extents(replay->reader);
    log::info("restore: replay; the bytes of {} VMM mappings come back as the program maps them again",
              replay->pending.size());
    g_replay = replay.release();
    return {};
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_INVALID_VALUE, "restore: {}", e.what());
  }
}

void vmm_replay_fill(vmm_state& s, std::uint64_t addr, std::uint64_t size) noexcept {
  replay_state* r = g_replay;
  const driver_api* d = driver();
  if (r == nullptr || d == nullptr) return;
  try {
    auto it = std::lower_bound(r->pending.begin(), r->pending.end(), addr,
                               [](const vmm_mapping& m, std::uint64_t at) { return m.addr < at; });
    while (it != r->pending.end() && it->addr + it->size <= addr + size) {
      // The same handle token at the same address, size and offset: the replayed run has made this very
      // mapping again (a range refilled later with another handle keeps its bytes for that one).
      const std::optional<vmm_mapping> now = s.registry.mapping_at(it->addr);
      const vmm_handle* h = now ? s.registry.find_handle(now->token) : nullptr;
      if (!now || !(*now == *it) || h == nullptr) {
        log::info("restore: replay; VMM memory at {} is not mapped as in the image yet (image: token {} size {}; "
                  "now: token {} size {})",
                  hex(it->addr), hex(it->token), it->size, now ? hex(now->token) : "none", now ? now->size : 0);
        ++it;  // not made again as it was: its bytes cannot be known to belong here
        continue;
      }
      if (const status filled = fill_mapping(*d, r->reader, *it, h->device); !filled.ok()) {
        log::error("restore: replay of the VMM mapping at {} failed; it holds what the driver gave", hex(it->addr));
      } else {
        r->filled_bytes += it->size;
        log::info("restore: replay; {} bytes of VMM memory back at {}", it->size, hex(it->addr));
      }
      it = r->pending.erase(it);
    }
    if (r->pending.empty()) {
      log::info("restore: replay; every VMM mapping's bytes are back ({} bytes)", r->filled_bytes);
      g_replay = nullptr;
      delete r;
    }
  } catch (const std::exception& e) {
    log::error("restore: replay of VMM memory at {}: {}", hex(addr), e.what());
  }
}

}  // namespace vmmckpt::detail
