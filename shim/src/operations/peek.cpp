// peek, poke and regions: the range a request names resolved to owned memory, ordered with the program's work as
// it asks, and copied through host memory on a stream of the shim's own (which waits for none of the program's).
#include "operations/peek.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <variant>

#include "core/context_scope.hpp"
#include "core/gate.hpp"
#include "core/real_symbols.hpp"
#include "memory/named_ranges.hpp"
#include "memory/not_owned_memory.hpp"
#include "memory/pools.hpp"
#include "memory/vmm_checkpoint.hpp"
#include "operations/process_control.hpp"
#include "operations/sealed_memfd.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/log.hpp"

namespace vmmckpt::detail {
namespace {

using clock = std::chrono::steady_clock;
using range_or_refusal = std::variant<control::peek_range, control::failure_reply>;

control::failure_reply failed(const std::string& why) { return {control::refusal::failed, why}; }

// The owned memory holding addr: a pool's live block, or a VMM mapping of the program's.
struct owned_block {
  int device = 0;
  std::uint64_t base = 0, size = 0;
};
std::optional<owned_block> owned_block_at(std::uint64_t addr) {
  if (device_pool* pool = pool_containing(addr)) {
    std::uint64_t base = 0, size = 0;
    if (!pool->address_range(addr, base, size)) return std::nullopt;
    return owned_block{pool_device_containing(addr), base, size};
  }
  for (const auto& m : vmm_mapped_ranges())
    if (addr - m.addr < m.size) return owned_block{m.device, m.addr, m.size};
  return std::nullopt;
}

// Why addr is none of the program's memory the shim owns, with what it does not own, as a dump says it.
std::string not_owned_text(std::uint64_t addr) {
  std::string text = hex(addr) + " is not in an allocation of this program that vmmckpt owns";
  std::string kinds;
  for (const auto& m : not_owned_memory())
    kinds += (kinds.empty() ? "" : ", ") + m.kind + " " + std::to_string(m.bytes) + " bytes";
  if (!kinds.empty())
    text += " (the program also has GPU memory vmmckpt does not own, which peek cannot read: " + kinds + ")";
  return text;
}

// A named range's bytes from `offset` on: addr and size as the shim's own.
std::optional<control::failure_reply> resolve_name(const std::string& name, std::uint64_t& addr, std::uint64_t& size) {
  const auto n = named(name);
  if (!n) return failed("no range of this program is named \"" + name + "\" (vmmckpt_name)");
  if (addr > n->size || size > n->size - addr)
    return failed("offset " + std::to_string(addr) + " and size " + std::to_string(size) + " run past \"" + name +
                  "\" (" + std::to_string(n->size) + " bytes)");
  if (size == 0) size = n->size - addr;
  addr += n->addr;
  return std::nullopt;
}

// The program's state allows its memory to be read: it is there (not suspended or paused).
std::optional<control::failure_reply> memory_present() {
  const process_state now = current_state();
  if (now == process_state::running || now == process_state::holding) return std::nullopt;
  return control::failure_reply{control::refusal::suspended,
                                "the program's GPU memory is given back (" + std::string(name_of(now)) + ")"};
}

// The range a request names, wholly inside one owned allocation whose memory is there.
range_or_refusal resolve(std::uint64_t addr, std::uint64_t size, const std::string& name) {
  if (auto refused = memory_present()) return *refused;
  if (!name.empty())
    if (auto refused = resolve_name(name, addr, size)) return *refused;
  const auto block = owned_block_at(addr);
  if (!block) return failed(not_owned_text(addr));
  const std::uint64_t left = block->base + block->size - addr;
  if (size == 0) size = left;
  if (size > left)
    return failed(hex(addr) + " + " + std::to_string(size) + " bytes runs past the end of its allocation [" +
                  hex(block->base) + ", +" + std::to_string(block->size) + ")");
  return control::peek_range{addr, size, block->device, block->base, block->size, name_holding(addr, size)};
}

// Copies between device memory and host memory on a stream of the shim's own, in the device's primary context.
std::string copy_device(const control::peek_range& r, void* host, bool to_host) {
  const driver_api* d = driver();
  if (d == nullptr) return "no CUDA driver";
  primary_context_scope context(*d, r.device);
  if (!context.active()) return "no context on device " + std::to_string(r.device);
  CUstream stream = nullptr;
  CUresult e = d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
  if (e == CUDA_SUCCESS) {
    e = to_host ? d->cuMemcpyDtoHAsync_v2(host, r.addr, r.size, stream)
                : d->cuMemcpyHtoDAsync_v2(r.addr, host, r.size, stream);
    if (e == CUDA_SUCCESS) e = d->cuStreamSynchronize(stream);
    d->cuStreamDestroy_v2(stream);
  }
  if (e == CUDA_SUCCESS) return {};
  return std::string(to_host ? "copying from " : "copying to ") + hex(r.addr) + " failed: CUDA error " +
         std::to_string(e);
}

// How a copy is ordered with the program's work, for the copy's duration: `quiesce` holds the operation lock and
// closes the gate (after the drain, every device synchronized); `ordered` waits for the work submitted so far.
class ordering {
 public:
  ordering(client_channel& client, control::peek_order order, std::chrono::milliseconds hold, std::int64_t valid_ms)
      : order_(order) {
    if (order == control::peek_order::ordered) synchronize_all();
    if (order != control::peek_order::quiesce) {
      ready_ = true;
      return;
    }
    operation_ = std::unique_lock(operation_lock(), std::defer_lock);
    if (!take_operation(client, operation_, valid_ms)) return;  // refused already
    start_ = clock::now();
    if (!the_gate().close(start_ + hold)) {
      refuse(client, control::refusal::not_quiesced,
             "the program did not quiesce within " + std::to_string(hold.count()) + " ms");
      return;
    }
    closed_ = true;
    synchronize_all();
    ready_ = true;
  }
  ~ordering() {
    if (closed_) the_gate().open();
  }
  ordering(const ordering&) = delete;
  ordering& operator=(const ordering&) = delete;
  bool ready() const { return ready_; }  // false: the client was answered already
  // quiesce: how long the program has been held.
  std::uint64_t held_us() const {
    if (!closed_) return 0;
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - start_).count());
  }

 private:
  control::peek_order order_;
  std::unique_lock<std::timed_mutex> operation_;
  clock::time_point start_{};
  bool closed_ = false, ready_ = false;
};

// map: the pool segments or the VMM handle under the range exported, one descriptor each, and where the range
// lies in them.
std::string export_pieces(const control::peek_range& r, std::vector<control::peek_piece>& pieces,
                          std::vector<int>& fds) {
  device_pool* pool = pool_containing(r.addr);
  if (pool == nullptr) {
    control::peek_piece piece;
    int fd = -1;
    std::string why = vmm_export_range(r.addr, r.size, piece, fd);
    if (why.empty()) {
      fds.push_back(fd);
      pieces.push_back(piece);
    }
    return why;
  }
  const driver_api* d = driver();
  std::uint64_t next = r.addr;
  for (const auto& s : pool->segments()) {
    if (next >= r.addr + r.size) break;
    if (next < s.addr || next - s.addr >= s.size) continue;
    int fd = -1;
    if (const CUresult e = d->cuMemExportToShareableHandle(&fd, s.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        e != CUDA_SUCCESS)
      return "exporting pool memory at " + hex(s.addr) + " failed: CUDA error " + std::to_string(e);
    fds.push_back(fd);
    const std::uint64_t size = std::min(s.addr + s.size, r.addr + r.size) - next;
    pieces.push_back({next, size, next - s.addr, s.size});
    next += size;
    if (fds.size() > static_cast<std::size_t>(protocol::max_fds_per_message))
      return "map: the range spans more segments than one reply carries; peek less of it at a time";
  }
  if (next != r.addr + r.size) return "map: part of the range has no physical memory under it";
  return {};
}

// The bytes of a peek by copy, as a sealed memfd.
std::variant<int, std::string> copied_out(const control::peek_range& r) {
  std::string why;
  const int fd = sealed_memfd("vmmckpt-peek", r.size, [&](unsigned char* at) {
    why = copy_device(r, at, true);
    return why.empty();
  });
  if (fd >= 0) return fd;
  return why.empty() ? "cannot make the copy's file: " + std::string(std::strerror(errno)) : why;
}

void answer_peek(client_channel& client, const control::peek_request& request, const control::peek_range& range) {
  control::peek_reply reply{range, request.order, request.via, 0, {}};
  std::vector<int> fds;
  ordering order(client, request.order, request.hold_deadline, request.valid_until_ms);
  if (!order.ready()) return;
  std::string why;
  if (request.via == control::peek_path::map) {
    why = export_pieces(range, reply.pieces, fds);
  } else {
    auto copied = copied_out(range);
    if (const int* fd = std::get_if<int>(&copied))
      fds.push_back(*fd);
    else
      why = std::get<std::string>(copied);
  }
  reply.held_us = order.held_us();
  if (why.empty())
    client.send(control::encode(reply), fds);
  else
    refuse(client, control::refusal::failed, why);
  protocol::close_all(fds);
}

// A poke's bytes: its one descriptor, a sealed file of exactly `size` bytes, mapped read-only.
struct poked_bytes {
  void* at = MAP_FAILED;
  std::size_t size = 0;
  poked_bytes(int fd, std::uint64_t expected, std::string& why) {
    struct stat st {};
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_WRITE)) != (F_SEAL_SHRINK | F_SEAL_WRITE)) {
      why = "poke's bytes come as a sealed memfd";
      return;
    }
    if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != expected) {
      why =
          "poke's file holds " + std::to_string(st.st_size) + " bytes, not the " + std::to_string(expected) + " asked";
      return;
    }
    size = static_cast<std::size_t>(expected);
    at = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) why = "cannot map poke's bytes: " + std::string(std::strerror(errno));
  }
  ~poked_bytes() {
    if (at != MAP_FAILED) ::munmap(at, size);
  }
  poked_bytes(const poked_bytes&) = delete;
  poked_bytes& operator=(const poked_bytes&) = delete;
};

}  // namespace

void serve_peek(client_channel& client, const control::peek_request& request) {
  const range_or_refusal resolved = resolve(request.addr, request.size, request.name);
  if (const auto* refused = std::get_if<control::failure_reply>(&resolved)) {
    client.send(control::encode(*refused));
    return;
  }
  const auto& range = std::get<control::peek_range>(resolved);
  if (request.via == control::peek_path::copy && range.size > control::max_peek_copy) {
    refuse(client, control::refusal::failed,
           std::to_string(range.size) + " bytes are more than a copy carries (" +
               std::to_string(control::max_peek_copy) + "); map them (--via map) or peek less");
    return;
  }
  answer_peek(client, request, range);
}

void serve_poke(client_channel& client, const control::poke_request& request, const std::vector<int>& fds) {
  if (fds.size() != 1) {
    refuse(client, control::refusal::bad_request, "poke carries one descriptor, its bytes");
    return;
  }
  const range_or_refusal resolved = resolve(request.addr, request.size, request.name);
  if (const auto* refused = std::get_if<control::failure_reply>(&resolved)) {
    client.send(control::encode(*refused));
    return;
  }
  auto range = std::get<control::peek_range>(resolved);
  std::string why;
  const poked_bytes bytes(fds[0], range.size, why);
  if (!why.empty()) {
    refuse(client, control::refusal::bad_request, why);
    return;
  }
  ordering order(client, request.order, request.hold_deadline, request.valid_until_ms);
  if (!order.ready()) return;
  why = copy_device(range, bytes.at, false);
  const std::uint64_t held = order.held_us();
  if (!why.empty()) {
    refuse(client, control::refusal::failed, why);
    return;
  }
  log::info("control: poke wrote {} bytes at {} (pid {} asked)", range.size, hex(range.addr), client.peer_pid());
  client.send(control::encode(control::poke_reply{range, held}));
}

void serve_regions(client_channel& client) {
  control::regions_reply reply;
  for (const auto& p : active_pools()) {
    control::pool_contents c{p.ordinal, p.pool->base(), p.pool->size(), 0, 0, p.pool->live_allocations(), {}, false};
    c.allocation_count = c.allocations.size();
    reply.pools.push_back(std::move(c));
  }
  for (const auto& m : vmm_mapped_ranges()) {
    if (reply.pools.empty() || !reply.pools.back().vmm || reply.pools.back().device != m.device)
      reply.pools.push_back({m.device, m.addr, 0, 0, 0, {}, {}, true});
    auto& pool = reply.pools.back();
    pool.allocations.push_back({m.addr, m.size, alloc_api::cu_mem_map});
    pool.allocation_count = pool.allocations.size();
    pool.size = m.addr + m.size - pool.base;
  }
  reply.names = all_names();
  const int table = allocation_table_memfd(reply.pools);
  if (table < 0) {
    refuse(client, control::refusal::failed, "cannot make the allocation table: " + std::string(std::strerror(errno)));
    return;
  }
  client.send(control::encode(reply), {table});
  ::close(table);
}

}  // namespace vmmckpt::detail
