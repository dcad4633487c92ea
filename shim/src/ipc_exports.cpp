// Legacy CUDA IPC, the exporting side. A handle names an allocation of the pool and one export of it; the
// importer gets the allocation's physical memory as POSIX FDs over the control channel, so that both
// processes map the same bytes (docs/ipc.md).
#include "ipc_exports.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include "pools.hpp"
#include "process_control.hpp"
#include "real_symbols.hpp"
#include "vmmckpt/hex_text.hpp"
#include "vmmckpt/log.hpp"
#include "vmmckpt/protocol.hpp"
#include "vmmckpt/pool_layout.hpp"
#include "vmmckpt/suspend_claim.hpp"

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
};

struct export_table {
  std::mutex mutex;
  std::map<std::uint64_t, export_record> by_base;
  std::uint64_t next_generation = 1;
  std::atomic<bool> any{false};  // lets every free skip the mutex until the first export
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
    t.any.store(true, std::memory_order_relaxed);
  }
  encode_ipc_handle(handle, out);
  log::debug("ipc: exported {} bytes at {} (generation {})", size, hex(base), handle.generation);
  result = CUDA_SUCCESS;
  return true;
}

void forget_exports(std::uint64_t base) noexcept {
  export_table& t = table();
  if (!t.any.load(std::memory_order_relaxed)) return;
  try {
    std::lock_guard lock(t.mutex);
    const auto it = t.by_base.find(base);
    if (it == t.by_base.end()) return;
    const auto mapped = std::count_if(it->second.importers.begin(), it->second.importers.end(), importer_alive);
    if (mapped > 0)
      log::warn("ipc: the allocation at {} was freed while {} other process(es) still map it; they see what this "
                "process allocates there next, not the old bytes",
                hex(base), mapped);
    t.by_base.erase(it);
  } catch (...) {
  }
}

std::variant<control::ipc_open_reply, control::failure_reply> open_export(const control::ipc_open_request& request,
                                                                          pid_t importer, std::vector<int>& fds) {
  const auto refuse = [](std::string why) { return control::failure_reply{control::refusal::failed, std::move(why)}; };
  export_table& t = table();
  std::lock_guard lock(t.mutex);
  const auto it = t.by_base.find(request.base);
  if (it == t.by_base.end() || it->second.generation != request.generation)
    return refuse("no allocation at " + hex(request.base) + " is exported under generation " +
                  std::to_string(request.generation) + " (freed, or never exported)");
  device_pool* pool = pool_containing(request.base);
  std::uint64_t base = 0, size = 0;
  if (pool == nullptr || !pool->address_range(request.base, base, size) || base != request.base)
    return refuse("the allocation at " + hex(request.base) + " is no longer live");
  const driver_api* d = driver();
  if (d == nullptr) return refuse("no CUDA driver");

  // Whole handles: the driver maps an imported handle only from its start. A small block's handle holds
  // its neighbours too, which the importer then maps as well; the handle says nothing of where they are.
  control::ipc_open_reply reply;
  std::uint64_t first = 0, covered = 0;
  for (const segment_info& s : pool->segments()) {  // in address order
    if (s.addr + s.size <= base || s.addr >= base + size) continue;
    if (reply.pieces.empty()) first = covered = s.addr;
    if (s.addr != covered) break;  // a gap: reported below
    int fd = -1;
    const CUresult e = d->cuMemExportToShareableHandle(&fd, s.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (e != CUDA_SUCCESS) {
      protocol::close_all(fds);
      return refuse("exporting the physical memory at " + hex(s.addr) + " failed: CUDA error " +
                    std::to_string(static_cast<int>(e)));
    }
    fds.push_back(fd);
    reply.pieces.push_back({s.addr - first, s.size});
    covered = s.addr + s.size;
  }
  if (reply.pieces.empty() || first > base || covered < base + size ||
      reply.pieces.size() > static_cast<std::size_t>(protocol::max_fds_per_message)) {
    protocol::close_all(fds);
    return refuse("the allocation at " + hex(base) + " is not backed by physical memory in one frame's pieces");
  }
  reply.base_offset = base - first;
  for (const auto& p : active_pools())
    if (p.pool == pool) reply.device_uuid = describe_device(p.ordinal).uuid;

  auto& importers = it->second.importers;
  const std::uint64_t start = suspend_claim::start_time(importer);
  auto rec = std::find_if(importers.begin(), importers.end(),
                          [&](const importer_record& r) { return r.pid == importer && r.start == start; });
  if (rec == importers.end()) rec = importers.insert(importers.end(), importer_record{importer, start, 0});
  ++rec->opens;
  log::info("ipc: process {} opened the {} bytes at {}", importer, size, hex(base));
  return reply;
}

void close_export(const control::ipc_close_request& request, pid_t importer) {
  export_table& t = table();
  std::lock_guard lock(t.mutex);
  const auto it = t.by_base.find(request.base);
  if (it == t.by_base.end() || it->second.generation != request.generation) return;
  for (auto& r : it->second.importers)
    if (r.pid == importer && r.opens > 0) --r.opens;
  std::erase_if(it->second.importers, [](const importer_record& r) { return !importer_alive(r); });
}

std::vector<pid_t> live_importers() {
  export_table& t = table();
  std::vector<pid_t> pids;
  if (!t.any.load(std::memory_order_relaxed)) return pids;
  std::lock_guard lock(t.mutex);
  for (auto& [base, r] : t.by_base) {
    std::erase_if(r.importers, [](const importer_record& i) { return !importer_alive(i); });
    for (const auto& i : r.importers)
      if (std::find(pids.begin(), pids.end(), i.pid) == pids.end()) pids.push_back(i.pid);
  }
  return pids;
}

}  // namespace vmmckpt::detail
