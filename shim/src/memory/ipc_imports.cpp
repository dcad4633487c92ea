// Legacy CUDA IPC, the importing side. The exporter's control server hands over the physical memory under
// the allocation as POSIX FDs; it is mapped here in an import window apart from the pools, the way the
// driver maps an IPC handle apart from the importer's own allocations (docs/ipc.md).
#include "memory/ipc_imports.hpp"

#include <unistd.h>

#include <map>
#include <mutex>
#include <optional>

#include "memory/cuda_backend.hpp"
#include "memory/peer_requests.hpp"
#include "core/real_symbols.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/support/status.hpp"
#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/pool/range_allocator.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/pool/vmm_layout.hpp"

namespace vmmckpt::detail {
namespace {

// The exporter answers after its operation lock, which a dump holds for up to its hold's length.
constexpr int open_timeout_ms = 60'000;
constexpr int close_timeout_ms = 2'000;

struct import_record {
  ipc_handle handle;
  std::string device_uuid;
  std::uint64_t window = 0;  // the mapping's start: the exporter's first handle under the allocation
  std::uint64_t window_size = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> pieces;  // mapped (addr, size)
  std::uint32_t refs = 0;
};

struct import_table {
  // Held for lookups and mapping, never while the exporter is asked (which may wait for its dump to end): a
  // dump of this process lists its imports meanwhile.
  std::mutex mutex;
  std::map<std::uint64_t, import_record> by_pointer;  // keyed by the pointer cuIpcOpenMemHandle returned
  range_allocator window{default_ipc_import_base, default_ipc_import_size};
};

import_table& table() {
  static import_table* t = new import_table;  // never destroyed: closes may come at exit
  return *t;
}

std::optional<std::string> ask_exporter(const ipc_handle& h, const control::request& request, int timeout_ms,
                                        std::vector<int>& fds, bool& gone) {
  return ask_process(static_cast<pid_t>(h.exporter_pid), request, {}, timeout_ms, fds, gone);
}

void tell_exporter_closed(const ipc_handle& h) {
  std::vector<int> fds;
  bool gone = false;
  ask_exporter(h, control::ipc_close_request{h.base, h.generation}, close_timeout_ms, fds, gone);
  protocol::close_all(fds);
}

void unmap(const driver_api& d, import_table& t, const import_record& r) {
  for (const auto& [addr, size] : r.pieces) d.cuMemUnmap(addr, size);
  d.cuMemAddressFree(r.window, r.window_size);
  if (t.window.retire(r.window)) t.window.reclaim_retired();
}

// Maps the pieces of an ipc_open reply, filling `r`; or why not (nothing left mapped).
status map_import(const driver_api& d, import_table& t, const control::ipc_open_reply& reply, std::vector<int>& fds,
                  CUdevice device, import_record& r) {
  std::uint64_t size = 0;
  for (const auto& p : reply.pieces) size = std::max(size, p.offset + p.size);
  if (reply.pieces.size() != fds.size() || size == 0 || size % vmm_granularity != 0 || reply.base_offset >= size)
    return failure(CUDA_ERROR_MAP_FAILED, "ipc: the exporter's answer describes no memory to map");
  r.window_size = size;
  const std::optional<std::uint64_t> hint = t.window.allocate(size);
  CUdeviceptr window = 0;
  CUresult e = d.cuMemAddressReserve(&window, size, vmm_granularity, hint.value_or(0), 0);
  if (e != CUDA_SUCCESS) {
    if (hint && t.window.retire(*hint)) t.window.reclaim_retired();
    return failure(e == CUDA_ERROR_OUT_OF_MEMORY ? e : CUDA_ERROR_MAP_FAILED,
                   "ipc: reserving {} bytes for imported memory failed: CUDA error {}", size, static_cast<int>(e));
  }
  if (hint && window != *hint && t.window.retire(*hint)) t.window.reclaim_retired();
  r.window = window;
  for (std::size_t i = 0; i < reply.pieces.size() && e == CUDA_SUCCESS; ++i) {
    const auto& p = reply.pieces[i];
    CUmemGenericAllocationHandle h = 0;
    e = d.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[i])),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (e != CUDA_SUCCESS) break;
    e = d.cuMemMap(window + p.offset, p.size, 0, h, 0);
    d.cuMemRelease(h);  // the mapping keeps the memory
    if (e == CUDA_SUCCESS) r.pieces.emplace_back(window + p.offset, p.size);
  }
  if (e == CUDA_SUCCESS) {
    const CUmemAccessDesc access = cuda_backend::read_write_from(device);
    e = d.cuMemSetAccess(window, size, &access, 1);
  }
  protocol::close_all(fds);
  if (e != CUDA_SUCCESS) {
    unmap(d, t, r);
    return failure(e == CUDA_ERROR_OUT_OF_MEMORY ? e : CUDA_ERROR_MAP_FAILED,
                   "ipc: mapping {} imported bytes failed: CUDA error {}", size, static_cast<int>(e));
  }
  r.device_uuid = reply.device_uuid;
  return {};
}

// The driver's own answers, measured on an H100 (docs/ipc.md), to an open it refuses before asking the exporter:
// bad flags or no out pointer, the exporter's own handle. CUDA_SUCCESS, and the current device, when it does not.
CUresult refuse_open(const driver_api* d, const ipc_handle& h, unsigned int flags, const CUdeviceptr* out,
                     CUdevice& device) {
  if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult e = d->cuCtxGetDevice(&device); e != CUDA_SUCCESS) return e;
  if (h.exporter_pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

// A handle opened already: one more reference to the same pointer, into `out`. Under t.mutex.
bool opened_already(import_table& t, const ipc_handle& h, CUdeviceptr* out) {
  for (auto& [pointer, r] : t.by_pointer)
    if (r.handle == h) {
      ++r.refs;
      *out = pointer;
      return true;
    }
  return false;
}

// The exporter's answer to ipc_open, its descriptors in `fds`; the driver's answer when there is none (an
// exporter gone, an allocation freed), every descriptor closed then.
CUresult ask_to_open(const ipc_handle& h, std::vector<int>& fds, control::ipc_open_reply& reply) {
  if (!suspend_claim::alive(h.exporter_pid, h.exporter_start)) return CUDA_ERROR_INVALID_HANDLE;
  bool gone = false;
  const auto payload = ask_exporter(h, control::ipc_open_request{h.base, h.generation}, open_timeout_ms, fds, gone);
  if (!payload) {
    protocol::close_all(fds);
    return gone ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_MAP_FAILED;
  }
  std::variant<control::ipc_open_reply, control::failure_reply> decoded;
  try {
    decoded = control::decode_reply<control::ipc_open_reply>(*payload);
  } catch (const std::exception& e) {
    protocol::close_all(fds);
    log::warn("ipc: process {} answered what is not an ipc_open reply: {}", h.exporter_pid, e.what());
    return CUDA_ERROR_MAP_FAILED;
  }
  if (const auto* refused = std::get_if<control::failure_reply>(&decoded)) {
    protocol::close_all(fds);
    log::info("ipc: process {} refused the handle: {}", h.exporter_pid, refused->error);
    return CUDA_ERROR_INVALID_VALUE;
  }
  reply = std::move(std::get<control::ipc_open_reply>(decoded));
  return CUDA_SUCCESS;
}

// Maps what the exporter sent and records it, unless another thread opened the handle while the exporter
// answered this one: this open is undone then. Takes the descriptors in `fds`.
CUresult map_and_record(const driver_api& d, import_table& t, const ipc_handle& h, const control::ipc_open_reply& reply,
                        std::vector<int>& fds, CUdevice device, CUdeviceptr* out) {
  std::unique_lock lock(t.mutex);
  if (opened_already(t, h, out)) {
    lock.unlock();
    protocol::close_all(fds);
    tell_exporter_closed(h);
    return CUDA_SUCCESS;
  }
  import_record r;
  r.handle = h;
  if (const CUresult e = map_import(d, t, reply, fds, device, r).code(); e != CUDA_SUCCESS) {
    lock.unlock();
    tell_exporter_closed(h);
    return e;
  }
  r.refs = 1;
  const std::uint64_t pointer = r.window + reply.base_offset;
  log::info("ipc: mapped {} bytes of process {} (its {:#x}) at {:#x}", h.size, h.exporter_pid, h.base, pointer);
  t.by_pointer.emplace(pointer, std::move(r));
  *out = pointer;
  return CUDA_SUCCESS;
}

}  // namespace

bool open_import(const unsigned char (&bytes)[ipc_handle_size], unsigned int flags, CUdeviceptr* out,
                 CUresult& result) {
  const std::optional<ipc_handle> decoded = decode_ipc_handle(bytes);
  if (!decoded) return false;
  const ipc_handle& h = *decoded;
  const driver_api* d = driver();
  CUdevice device = 0;
  if (result = refuse_open(d, h, flags, out, device); result != CUDA_SUCCESS) return true;
  import_table& t = table();
  {
    std::lock_guard lock(t.mutex);
    if (opened_already(t, h, out)) {
      result = CUDA_SUCCESS;
      return true;
    }
  }
  std::vector<int> fds;
  control::ipc_open_reply reply;
  if (result = ask_to_open(h, fds, reply); result != CUDA_SUCCESS) return true;
  result = map_and_record(*d, t, h, reply, fds, device, out);
  return true;
}

bool close_import(CUdeviceptr ptr, CUresult& result) {
  const driver_api* d = driver();
  if (d == nullptr) return false;
  import_table& t = table();
  std::optional<ipc_handle> closed;
  {
    std::lock_guard lock(t.mutex);
    const auto it = t.by_pointer.find(ptr);
    if (it == t.by_pointer.end()) {
      for (const auto& [pointer, r] : t.by_pointer)
        if (ptr >= r.window && ptr < r.window + r.window_size) {
          result = CUDA_ERROR_INVALID_VALUE;  // an interior pointer, as the driver answers
          return true;
        }
      return false;
    }
    result = CUDA_SUCCESS;
    if (--it->second.refs > 0) return true;
    // Work already submitted may still read the memory; the driver's close waits for it too.
    d->cuCtxSynchronize();
    unmap(*d, t, it->second);
    closed = it->second.handle;
    t.by_pointer.erase(it);
  }
  tell_exporter_closed(*closed);
  return true;
}

std::vector<ipc_import> current_imports() {
  import_table& t = table();
  std::vector<ipc_import> out;
  std::lock_guard lock(t.mutex);
  for (const auto& [pointer, r] : t.by_pointer)
    out.push_back({r.handle.exporter_pid, r.handle.base, r.handle.size, pointer, r.device_uuid});
  return out;
}

}  // namespace vmmckpt::detail
