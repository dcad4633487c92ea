// Legacy CUDA IPC, the exporting side. A handle names an allocation of the pool and one export of it; the
// importer gets the allocation's physical memory as POSIX FDs over the control channel, so that both
// processes map the same bytes (docs/ipc.md).
#include "memory/ipc_exports.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>

#include "memory/pools.hpp"
#include "memory/devices.hpp"
#include "core/real_symbols.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::detail {
namespace {

struct importer_record {
  pid_t pid = 0;
  std::uint64_t start = 0;
  std::uint32_t opens = 0;  // ipc_open requests not yet matched by an ipc_close
};

struct export_record {
  std::uint64_t size = 0;
  std::uint64_t generation = 0;
  std::vector<importer_record> importers;
  bool freed = false;  // the program freed it while importers mapped it: the block waits for them
};

struct export_table {
  std::mutex mutex;
  std::map<std::uint64_t, export_record> by_base;
  std::uint64_t next_generation = 1;
};

export_table& table() {
  static export_table* t = new export_table;  // never destroyed: frees may come at exit
  return *t;
}

bool importer_alive(const importer_record& r) { return r.opens > 0 && suspend_claim::alive(r.pid, r.start); }

}  // namespace

bool export_pool_memory(CUdeviceptr addr, unsigned char (&out)[ipc_handle_size], CUresult& result) {
  device_pool* pool = pool_containing(addr);
  if (pool == nullptr) return false;
  std::uint64_t base = 0, size = 0;
  if (!pool->address_range(addr, base, size)) {
    result = CUDA_ERROR_INVALID_VALUE;  // what the driver answers for memory that is not a live allocation
    return true;
  }
  ipc_handle handle;
  handle.exporter_pid = getpid();
  handle.exporter_start = suspend_claim::start_time(handle.exporter_pid);
  handle.base = base;
  handle.size = size;
  export_table& t = table();
  {
    std::lock_guard lock(t.mutex);
    export_record& r = t.by_base[base];
    if (r.generation == 0 || r.size != size) r = export_record{size, t.next_generation++, {}};
    handle.generation = r.generation;
    any_pool_memory_exported.store(true, std::memory_order_relaxed);
  }
  encode_ipc_handle(handle, out);
  log::debug("ipc: exported {} bytes at {} (generation {})", size, hex(base), handle.generation);
  result = CUDA_SUCCESS;
  return true;
}

std::optional<CUresult> free_exported(std::uint64_t base) noexcept {
  try {
    export_table& t = table();
    std::lock_guard lock(t.mutex);
    const auto it = t.by_base.find(base);
    if (it == t.by_base.end()) return std::nullopt;
    if (it->second.freed) return CUDA_ERROR_INVALID_VALUE;  // freed twice
    std::erase_if(it->second.importers, [](const importer_record& r) { return !importer_alive(r); });
    if (it->second.importers.empty()) {
      t.by_base.erase(it);
      return std::nullopt;
    }
    // The driver keeps memory alive while another process maps it; the pool does the same for the block, so
    // that what this process allocates next never lands in memory the importers still use.
    it->second.freed = true;
    log::info("ipc: the allocation at {} was freed while {} other process(es) still map it; it is kept until they "
              "close it",
              hex(base), it->second.importers.size());
    return CUDA_SUCCESS;
  } catch (...) {
    return std::nullopt;
  }
}

namespace {

// Whole handles: the driver maps an imported handle only from its start. A small block's handle holds
// its neighbours too, which the importer then maps as well; the handle says nothing of where they are.
// The pieces covering [base, base + size) into `reply`, one descriptor each into `fds`; or why not, every
// descriptor closed then.
std::string export_pieces(const driver_api& d, device_pool& pool, std::uint64_t base, std::uint64_t size,
                          control::ipc_open_reply& reply, std::vector<int>& fds) {
  std::uint64_t first = 0, covered = 0;
  for (const segment_info& s : pool.segments()) {  // in address order
    if (s.addr + s.size <= base || s.addr >= base + size) continue;
    if (reply.pieces.empty()) first = covered = s.addr;
    if (s.addr != covered) break;  // a gap: reported below
    int fd = -1;
    const CUresult e = d.cuMemExportToShareableHandle(&fd, s.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (e != CUDA_SUCCESS) {
      protocol::close_all(fds);
      return "exporting the physical memory at " + hex(s.addr) + " failed: CUDA error " +
             std::to_string(static_cast<int>(e));
    }
    fds.push_back(fd);
    reply.pieces.push_back({s.addr - first, s.size});
    covered = s.addr + s.size;
  }
  if (reply.pieces.empty() || first > base || covered < base + size ||
      reply.pieces.size() > static_cast<std::size_t>(protocol::max_fds_per_message)) {
    protocol::close_all(fds);
    return "the allocation at " + hex(base) + " is not backed by physical memory in one frame's pieces";
  }
  reply.base_offset = base - first;
  return {};
}

// One more open of the export by `importer`.
void count_open(export_record& r, pid_t importer) {
  const std::uint64_t start = suspend_claim::start_time(importer);
  auto rec = std::find_if(r.importers.begin(), r.importers.end(),
                          [&](const importer_record& i) { return i.pid == importer && i.start == start; });
  if (rec == r.importers.end()) rec = r.importers.insert(r.importers.end(), importer_record{importer, start, 0});
  ++rec->opens;
}

}  // namespace

std::variant<control::ipc_open_reply, control::failure_reply> open_export(const control::ipc_open_request& request,
                                                                          pid_t importer, std::vector<int>& fds) {
  const auto refuse = [](std::string why) { return control::failure_reply{control::refusal::failed, std::move(why)}; };
  export_table& t = table();
  std::lock_guard lock(t.mutex);
  const auto it = t.by_base.find(request.base);
  if (it == t.by_base.end() || it->second.generation != request.generation || it->second.freed)
    return refuse("no allocation at " + hex(request.base) + " is exported under generation " +
                  std::to_string(request.generation) + " (freed, or never exported)");
  device_pool* pool = pool_containing(request.base);
  std::uint64_t base = 0, size = 0;
  if (pool == nullptr || !pool->address_range(request.base, base, size) || base != request.base)
    return refuse("the allocation at " + hex(request.base) + " is no longer live");
  const driver_api* d = driver();
  if (d == nullptr) return refuse("no CUDA driver");
  control::ipc_open_reply reply;
  if (std::string why = export_pieces(*d, *pool, base, size, reply, fds); !why.empty()) return refuse(std::move(why));
  for (const auto& p : active_pools())
    if (p.pool == pool) reply.device_uuid = describe_device(p.ordinal).uuid;
  count_open(it->second, importer);
  log::info("ipc: process {} opened the {} bytes at {}", importer, size, hex(base));
  return reply;
}

namespace {
// Blocks freed while imported whose importers are all gone now: taken off the table, for the caller to
// give back to their pools once the table's lock is let go. Under the lock.
std::vector<std::uint64_t> take_released(export_table& t) {
  std::vector<std::uint64_t> bases;
  for (auto it = t.by_base.begin(); it != t.by_base.end();) {
    std::erase_if(it->second.importers, [](const importer_record& i) { return !importer_alive(i); });
    if (it->second.freed && it->second.importers.empty()) {
      bases.push_back(it->first);
      it = t.by_base.erase(it);
    } else {
      ++it;
    }
  }
  return bases;
}

void free_released(const std::vector<std::uint64_t>& bases) {
  for (const std::uint64_t base : bases)
    if (device_pool* pool = pool_containing(base)) {
      pool->free(base);
      log::info("ipc: the allocation at {} freed earlier goes back to the pool: no process maps it any more",
                hex(base));
    }
}
}  // namespace

void close_export(const control::ipc_close_request& request, pid_t importer) {
  export_table& t = table();
  std::vector<std::uint64_t> released;
  {
    std::lock_guard lock(t.mutex);
    const auto it = t.by_base.find(request.base);
    if (it == t.by_base.end() || it->second.generation != request.generation) return;
    for (auto& r : it->second.importers)
      if (r.pid == importer && r.opens > 0) --r.opens;
    released = take_released(t);
  }
  free_released(released);
}

std::vector<pid_t> live_importers() {
  export_table& t = table();
  std::vector<pid_t> pids;
  if (!any_pool_memory_exported.load(std::memory_order_relaxed)) return pids;
  std::vector<std::uint64_t> released;
  {
    std::lock_guard lock(t.mutex);
    released = take_released(t);
    for (auto& [base, r] : t.by_base)
      for (const auto& i : r.importers)
        if (std::find(pids.begin(), pids.end(), i.pid) == pids.end()) pids.push_back(i.pid);
  }
  free_released(released);
  return pids;
}

}  // namespace vmmckpt::detail
