// What cuda-ckpt asks of this process: describe it, check its pools, hold it, suspend it.
#include "operations/process_control.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <atomic>
#include <fstream>
#include <memory>
#include <mutex>

#include "core/context_scope.hpp"
#include "memory/devices.hpp"
#include "core/gate.hpp"
#include "operations/sealed_memfd.hpp"
#include "memory/ipc_imports.hpp"
#include "memory/not_owned_memory.hpp"
#include "memory/pools.hpp"
#include "memory/program_pools.hpp"
#include "core/real_symbols.hpp"
#include "operations/job_cut.hpp"
#include "operations/operations.hpp"
#include "memory/vmm_checkpoint.hpp"
#include "memory/vmm_sharing.hpp"
#include "memory/vmm_state.hpp"
#include "vmmckpt/support/descriptor_room.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/host_pages.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/restore/pool_restore.hpp"
#include "vmmckpt/restore/upload.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/support/uuid_text.hpp"

namespace vmmckpt::detail {
namespace {

using clock = std::chrono::steady_clock;

// Descriptors the driver may open during the exports, beyond those the hold hands over.
constexpr std::size_t spare_descriptors = 16;
// Address space a resume needs besides its load buffers: the connection's thread and the streams' (8 MiB of
// stack each by default) and what the driver maps for them.
constexpr std::size_t resume_room_bytes = 64ULL << 20;

std::mutex g_image_mutex;  // g_suspend_image, which hello reads
suspend_record g_suspend_image;
clock::time_point g_hold_start;

// The state hello reports: a resume in progress is still suspended, a hold still running.
control::process_state reported_state() {
  switch (current_state()) {
    case process_state::suspended: return control::process_state::suspended;
    case process_state::paused: return control::process_state::paused;
    case process_state::restoring:
      return suspended_image().image.empty() ? control::process_state::running : control::process_state::suspended;
    case process_state::running:
    case process_state::holding: break;
  }
  return control::process_state::running;
}

std::vector<std::string> command_line() {
  std::vector<std::string> args;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}


// Bytes in use on the device now, the program's context and unserved memory included (and other
// processes' too: the driver counts the whole device).
std::uint64_t device_used_bytes(int ordinal) {
  const driver_api* d = driver();
  if (d == nullptr) return 0;
  primary_context_scope scope(*d, ordinal);  // the pool holds its own reference
  std::size_t free_bytes = 0, total = 0;
  if (scope.active()) d->cuMemGetInfo_v2(&free_bytes, &total);
  return total - free_bytes;
}

// Adds device `ordinal`'s description to `devices` unless it is there already (a device with a pool and
// program-made VMM memory is described once).
void describe_once(std::vector<device_description>& devices, int ordinal) {
  for (const auto& dev : devices)
    if (dev.ordinal == ordinal) return;
  devices.push_back(describe_device(ordinal));
}

double us_since(clock::time_point t) { return std::chrono::duration<double, std::micro>(clock::now() - t).count(); }

std::uint64_t held_us() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - g_hold_start).count());
}

// A hold's allocation table made ahead of the hold (prepare_hold), while the program runs on:
// listing 200 000 blocks and writing their table takes tens of milliseconds. The hold takes it
// only when no pool allocated or freed a block since, which the pools' change counts tell.
struct prepared_table {
  std::vector<std::pair<device_pool*, std::uint64_t>> changes;  // each pool and its count when listed
  std::vector<std::vector<allocation>> allocations;             // each pool's, in the same order
  int fd = -1;                                                  // the table's sealed memfd
  ~prepared_table() {
    if (fd >= 0) ::close(fd);
  }
};
std::mutex g_prepared_mutex;
std::unique_ptr<prepared_table> g_prepared;

// The prepared table if it is still true of every pool (each listed, in order, none changed).
std::unique_ptr<prepared_table> take_prepared(const std::vector<active_pool>& pools) {
  std::unique_ptr<prepared_table> prepared;
  {
    std::lock_guard lock(g_prepared_mutex);
    prepared = std::move(g_prepared);
  }
  if (!prepared || prepared->changes.size() != pools.size()) return nullptr;
  for (std::size_t i = 0; i < pools.size(); ++i)
    if (prepared->changes[i].first != pools[i].pool || prepared->changes[i].second != pools[i].pool->changes())
      return nullptr;
  return prepared;
}

// Each pool's blocks into `r`, from the prepared table where there is one; how many.
std::size_t list_blocks(const std::vector<active_pool>& pools, prepared_table* prepared, control::dump_begin_reply& r) {
  std::size_t blocks = 0;
  for (std::size_t i = 0; i < pools.size(); ++i) {
    control::pool_contents c{
        pools[i].ordinal, pools[i].pool->base(), pools[i].pool->size(), large_alignment, 0, {}, {}};
    c.allocations = prepared ? std::move(prepared->allocations[i]) : pools[i].pool->live_allocations();
    c.allocation_count = c.allocations.size();
    blocks += c.allocations.size();
    r.pools.push_back(std::move(c));
  }
  return blocks;
}

// Each pool's segments exported, one descriptor each into `fds`, and its device described; why not, when one
// cannot be exported.
std::string export_segments(const std::vector<active_pool>& pools, control::dump_begin_reply& r, std::vector<int>& fds,
                            std::size_t& segments) {
  const driver_api* d = driver();
  for (std::size_t i = 0; i < pools.size(); ++i) {
    for (const auto& s : pools[i].pool->segments()) {
      int exported = -1;
      const CUresult e =
          d->cuMemExportToShareableHandle(&exported, s.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (e != CUDA_SUCCESS)
        return "exporting pool memory at " + hex(s.addr) + " failed: CUDA error " + std::to_string(e);
      fds.push_back(exported);
      r.pools[i].segments.push_back({s.addr, s.size});
      ++segments;
    }
    r.devices.push_back(describe_device(pools[i].ordinal));
  }
  return {};
}

// Program-made VMM memory: its pools follow the pool's, its handles' descriptors the segments'. A prepared
// table, made without them, is dropped when there are any. Why not, when they cannot be exported.
std::string export_vmm(control::dump_begin_reply& r, std::vector<int>& fds, std::unique_ptr<prepared_table>& prepared) {
  const std::size_t before_vmm = r.pools.size();
  if (std::string why = vmm_hold_contents(r, fds); !why.empty()) return why;
  for (std::size_t i = before_vmm; i < r.pools.size(); ++i) describe_once(r.devices, r.pools[i].device);
  if (r.pools.size() > before_vmm && prepared) {
    ::close(prepared->fd);  // made without the VMM pools: made again by allocation_table()
    prepared->fd = -1;
    prepared.reset();
  }
  return {};
}

// The allocation table's descriptor: the prepared one, handed over (closed with the others once sent), or one
// made now; -1 (errno set) when it cannot be made.
int allocation_table(const control::dump_begin_reply& r, prepared_table* prepared) {
  if (!prepared) return allocation_table_memfd(r.pools);
  const int table = prepared->fd;
  prepared->fd = -1;
  return table;
}

// The held program's pools: each one's blocks, its segments exported (one descriptor each in `fds`),
// and the allocation table's descriptor last (on a failure the caller closes those sent so far).
// Throws only for want of memory.
std::variant<control::dump_begin_reply, control::failure_reply> held_contents(double quiesce_us,
                                                                              std::vector<int>& fds) {
  const auto pools = active_pools();
  control::dump_begin_reply r;
  // Where the hold's time goes, in the log: with a million allocations each part shows.
  const double sync_us = synchronize_all();
  auto t = clock::now();
  std::unique_ptr<prepared_table> prepared = take_prepared(pools);
  const std::size_t blocks = list_blocks(pools, prepared.get(), r);
  const double list_us = us_since(t);
  t = clock::now();
  std::size_t segments = 0;
  std::string why = export_segments(pools, r, fds, segments);
  if (why.empty()) why = export_vmm(r, fds, prepared);
  if (!why.empty()) {
    release("export failed");
    return control::failure_reply{control::refusal::failed, why};
  }
  const double export_us = us_since(t);
  t = clock::now();
  const int table = allocation_table(r, prepared.get());
  if (table < 0) {
    const int err = errno;
    release("the allocation table could not be made");
    return control::failure_reply{control::refusal::failed,
                                  "cannot make the allocation table: " + std::string(std::strerror(err))};
  }
  fds.push_back(table);
  r.fd_count = static_cast<std::uint32_t>(fds.size());
  r.not_owned = not_owned_memory();
  r.ipc_imports = current_imports();
  log::info("control: held; quiesced in {:.0f} us, synchronized in {:.0f} us, {} blocks {} in {:.0f} us, {} segments "
            "exported in {:.0f} us, the table {} in {:.0f} us",
            quiesce_us, sync_us, blocks, prepared ? "listed beforehand, unchanged, taken" : "listed", list_us, segments,
            export_us, prepared ? "taken" : "made", us_since(t));
  return r;
}

}  // namespace

double synchronize_all() {
  const auto t = clock::now();
  for (const auto& p : active_pools()) p.pool->synchronize();
  vmm_synchronize();  // kernels may still write program-made VMM memory on devices without a pool
  return us_since(t);
}

int allocation_table_memfd(const std::vector<control::pool_contents>& pools) {
  // Encoded straight into the file's mapped pages: a million allocations are 24 MB.
  return sealed_memfd("vmmckpt-allocation-table", control::allocation_table_bytes(pools), [&](unsigned char* at) {
    control::encode_allocation_table(pools, at);
    return true;
  });
}

suspend_record suspended_image() {
  std::lock_guard lock(g_image_mutex);
  return g_suspend_image;
}

host_pages& resume_buffers() {
  static host_pages* pages = new host_pages;
  return *pages;
}

control::hello_reply describe_process() {
  control::hello_reply r;
  r.protocol = protocol::version;
  r.pid = getpid();
  r.command = command_line();
  r.state = reported_state();
  if (r.state == control::process_state::suspended) r.image = suspended_image().image;
  for (const auto& p : active_pools()) {
    r.devices.push_back(describe_device(p.ordinal));
    const pool_stats s = p.pool->stats();
    r.pools.push_back({p.ordinal, p.pool->base(), p.pool->size(), s.live_bytes, s.live_count, s.backed_bytes});
  }
  for (control::pool_summary& v : vmm_summaries()) {
    describe_once(r.devices, v.device);
    r.pools.push_back(v);
  }
  r.not_owned = not_owned_memory();
  r.nccl_bytes = nccl_vmm_bytes() + nccl_pool_bytes();
  return r;
}

control::check_reply check_pools() {
  control::check_reply r;
  for (const auto& p : active_pools())
    if (std::string why = p.pool->check_invariants(); !why.empty())
      r.problems.push_back("device " + std::to_string(p.ordinal) + ": " + why);
  r.consistent = r.problems.empty();
  return r;
}

std::variant<control::dump_begin_reply, control::failure_reply> hold(clock::time_point hold_deadline_at,
                                                                     std::vector<int>& fds) {
  const process_state now = current_state();
  if (now == process_state::suspended)
    return control::failure_reply{control::refusal::suspended,
                                  "the program is suspended (image " + suspended_image().image + "); resume it first"};
  if (now == process_state::restoring)  // only a restore at start: a resume holds the operation lock
    return control::failure_reply{control::refusal::suspended,
                                  "the program's memory is being restored from its image; try again once it runs"};
  if (now == process_state::paused)
    return control::failure_reply{control::refusal::suspended,
                                  "the program has paused its own GPU memory (vmmckpt_pause); it resumes it itself"};
  g_hold_start = clock::now();
  enter_state(process_state::holding);
  fault_point("program:holding");  // the tests make the program slow to drain here
  if (!the_gate().close(hold_deadline_at)) {
    enter_state(process_state::running);
    return control::failure_reply{
        control::refusal::not_quiesced,
        "the program did not quiesce within " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::milliseconds>(hold_deadline_at - g_hold_start).count()) +
            " ms"};
  }
  try {
    return held_contents(us_since(g_hold_start), fds);
  } catch (const std::exception& e) {
    // Out of memory: nothing is handed over (the caller closes `fds`), and the program goes on.
    release("the hold could not be described");
    return control::failure_reply{control::refusal::failed,
                                  std::string("cannot describe the held memory: ") + e.what()};
  }
}

void prepare_hold() noexcept {
  try {
    // The hold exports a descriptor per segment and per VMM handle, and the table's: room for them now,
    // since a table grown in the hold makes it wait for an RCU grace period (descriptor_room.hpp).
    std::size_t exported = 1 + vmm_handle_count();
    for (const auto& p : active_pools()) exported += p.pool->segments().size();
    make_room_for_descriptors(static_cast<int>(std::min<std::size_t>(exported + spare_descriptors, INT_MAX)));
    auto prepared = std::make_unique<prepared_table>();
    control::dump_begin_reply r;
    for (const auto& p : active_pools()) {
      const std::uint64_t before = p.pool->changes();
      control::pool_contents c{p.ordinal, p.pool->base(), p.pool->size(), large_alignment, 0, {}, {}};
      c.allocations = p.pool->live_allocations_unlocked();
      if (p.pool->changes() != before) return;  // allocating meanwhile: the hold lists for itself
      c.allocation_count = c.allocations.size();
      prepared->changes.emplace_back(p.pool, before);
      r.pools.push_back(std::move(c));
    }
    prepared->fd = allocation_table_memfd(r.pools);
    if (prepared->fd < 0) return;
    for (auto& c : r.pools) prepared->allocations.push_back(std::move(c.allocations));
    std::lock_guard lock(g_prepared_mutex);
    g_prepared = std::move(prepared);
  } catch (...) {
    // Out of memory: the hold lists for itself.
  }
}

std::uint64_t release(const char* why) {
  enter_state(process_state::running);
  the_gate().open();
  const std::uint64_t held = held_us();
  log::info("control: program released after {} us ({})", held, why);
  return held;
}

std::string reserve_resume_room() noexcept {
  // Its load buffers are kept; room for the threads and streams it starts is only checked (address space, as
  // `ulimit -v` counts it).
  if (resume_buffers().data() == nullptr) resume_buffers() = host_pages(restore::load_buffer_bytes());
  void* room = ::mmap(nullptr, resume_room_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (room != MAP_FAILED) ::munmap(room, resume_room_bytes);
  if (resume_buffers().data() != nullptr && room != MAP_FAILED) return {};
  resume_buffers() = host_pages();
  return "no host memory for what its resume will need (" + std::to_string(restore::load_buffer_bytes() >> 20) +
         " MiB of buffers and " + std::to_string(resume_room_bytes >> 20) +
         " MiB for its threads; the address space is limited, ulimit -v?): the program goes on, not suspended";
}

std::variant<control::suspend_reply, control::failure_reply> suspend_held(const control::suspend_request& request,
                                                                          bool job_rank) {
  fault_point("program:suspend-received");  // the reliability tests stop the program here, and below
  // A job's rank does not refuse once the job's claim is accepted: every other rank is suspended or suspends
  // itself, and this one must be too (its resume's room was set aside before its hold, when it could refuse).
  if (!job_rank && control::unix_ms_now() > request.valid_until_ms) {
    release("the suspend request arrived after it expired");
    return control::failure_reply{control::refusal::expired,
                                  "the suspend request arrived after it expired (the program was stopped, or the "
                                  "tool waited too long): the program goes on, not suspended"};
  }
  // What the resume will need is set aside now, while the suspend can still be refused: after the claim the
  // program depends on its resume.
  if (const std::string why = reserve_resume_room(); !why.empty() && !job_rank) {
    release("no host memory for the resume");
    return control::failure_reply{control::refusal::failed, why};
  }
  // The claim decides (suspend_claim.hpp): from here on this program depends on the image, or the tool has
  // withdrawn it and the image goes. A job's rank is decided by the job's claim; its own is taken for ps and gc.
  if (!suspend_claim::take(request.image, suspend_claim::accepted) && !job_rank) {
    release("the suspend was withdrawn");
    return control::failure_reply{control::refusal::withdrawn, "the suspend was withdrawn (" + request.image +
                                                                   " has no pending claim): the "
                                                                   "program goes on, not suspended"};
  }
  fault_point("program:claimed");
  struct stat st {};
  ::stat(request.image.c_str(), &st);
  control::suspend_reply r;
  if (job_rank) {
    // The other ranks' memory goes first: their own suspends free it only once nobody maps it.
    job_cut::hold_while_suspended(true);
    const std::uint64_t unmapped = vmm_drop_imports();
    log::info("control: a job's rank: {} bytes of the other ranks' memory no longer mapped", unmapped);
  }
  for (const auto& p : active_pools()) r.freed_bytes += p.pool->release_all_physical();
  r.freed_bytes += vmm_release_physical();
  forget_exports();
  try {
    for (const auto& dev : describe_process().devices)
      r.devices.push_back({dev.ordinal, device_used_bytes(dev.ordinal)});
  } catch (...) {
    // Out of memory: the reply goes without the devices' figures; the suspend itself is done.
  }
  {
    std::lock_guard lock(g_image_mutex);
    g_suspend_image = {request.image, request.image_id, st.st_dev, st.st_ino};
  }
  enter_state(process_state::suspended);
  fault_point("program:suspended");
  r.held_us = held_us();
  log::info("control: suspended; {} bytes of GPU memory given back; image {}", r.freed_bytes, request.image);
  return r;
}

}  // namespace vmmckpt::detail
