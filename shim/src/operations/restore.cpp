// The process's side of every restore: an image restored into a new process (at its first memory call, the
// image's allocations come back at their addresses) and a suspended program resumed from its image.
#include "operations/restore.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>

#include "core/gate.hpp"
#include "memory/pools.hpp"
#include "operations/job_cut.hpp"
#include "operations/operations.hpp"
#include "operations/process_control.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "core/real_symbols.hpp"
#include "memory/vmm_checkpoint.hpp"
#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/restore/handoff.hpp"
#include "vmmckpt/restore/pool_restore.hpp"
#include "vmmckpt/restore/upload.hpp"

namespace vmmckpt::detail {
namespace {

enum state : int { unchecked, nothing_to_restore, restored, failed };
std::atomic<int> g_state{unchecked};

// Whether fd is still the socket cuda-ckpt restore made before it exec'd this program (the program
// may have closed it and reused the number): that very socket (its inode), SOCK_SEQPACKET, made by this pid.
bool is_progress_socket(int fd, std::uint64_t inode) noexcept {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != inode) return false;
  int type = 0;
  socklen_t length = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_SEQPACKET) return false;
  ucred peer{};
  length = sizeof peer;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && peer.pid == ::getpid();
}

// Progress frames on cuda-ckpt restore's socket, when it gave one (as upload() reports them, at most
// ten a second), sent without waiting or raising SIGPIPE.
restore::upload_progress progress_to(int fd, std::uint64_t inode) {
  if (!is_progress_socket(fd, inode)) return {};
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // the program's own children are not the tool's business
  return [fd](std::uint64_t done, std::uint64_t total) {
    const std::string frame = control::encode(control::progress_frame{done, total});
    ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  };
}

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
    VMMCKPT_TRY(restore::upload(*d, reader, pool_memory_backed(), h.how != restore::mode::replay,
                                progress_to(h.progress_fd, h.progress_inode)));
    const auto now = clock::now();
    std::size_t blocks = 0;
    for (const auto& p : m.pools) blocks += p.allocations.size();
    log::info("restore: {} allocations, {} bytes from {} in {:.3f} s (placing {:.3f} s, loading {:.3f} s){}", blocks,
              image::restored_bytes(m), h.image, std::chrono::duration<double>(now - start).count(),
              std::chrono::duration<double>(placed - start).count(),
              std::chrono::duration<double>(now - placed).count(),
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
  enter_state(process_state::restoring);
  const bool ok = restore_image(*handoff).ok();
  enter_state(process_state::running);
  // Closed, loaded or not: the tool's progress line ends.
  if (is_progress_socket(handoff->progress_fd, handoff->progress_inode)) ::close(handoff->progress_fd);
  if (!ok) log::error("restore: the image was not restored; every memory call of this process will fail");
  g_state.store(ok ? restored : failed, std::memory_order_release);
  return ok;
}

// A suspended program whose memory is back while it stays held: a job's rank between the two stages of the
// job's resume, waiting for the other ranks' memory (or for a new resume, if its tool went away meanwhile).
std::atomic<bool> g_loaded{false};

// The suspended program's memory back from the image its suspend took, made again at the same addresses
// and loaded. The program stays suspended when it fails (what was made is given back).
std::variant<control::resume_reply, control::failure_reply> load_suspended(const control::resume_request& request,
                                                                           const restore::upload_progress& progress) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const driver_api* d = driver();
  const suspend_record suspended = suspended_image();
  std::string image = suspended.image;
  auto refuse = [&](const std::string& why) {
    return control::failure_reply{control::refusal::failed,
                                  "cannot resume from " + image + ": " + why + "; the program stays suspended"};
  };
  if (d == nullptr) return refuse("no CUDA driver");
  fault_point("program:resuming");  // the ps test pauses here: a long resume
  if (!request.image.empty()) {
    // A whole process brought back by CRIU: its image is where the tool says (moved with the
    // whole-process image, or on another machine); the image_id below still must be suspend's.
    image = request.image;
  } else {
    // Only the image suspend took: the same directory (not a symlink put in its place, not another
    // directory moved there) holding the same image.
    struct stat st {};
    if (::lstat(image.c_str(), &st) != 0) return refuse(std::string("it is gone: ") + std::strerror(errno));
    if (S_ISLNK(st.st_mode)) return refuse("it has been replaced by a symbolic link");
    if (st.st_dev != suspended.dev || st.st_ino != suspended.ino)
      return refuse("it has been replaced by another directory");
  }
  std::uint64_t bytes = 0;
  try {
    const auto reader = image::reader::open(image);
    if (reader.info().image_id != suspended.image_id)
      return refuse("it holds another image (image_id " + reader.info().image_id + ", suspend wrote " +
                    suspended.image_id + ")");
    reader.verify_manifest();  // extents are checked as they load
    std::vector<device_pool*> backed;
    const status placed = restore::back_suspended_pools(
        reader.info(), [](std::uint64_t base) { return pool_containing(base); }, backed);
    if (!placed.ok()) return refuse(placed.message());
    const auto loading = clock::now();
    if (const status vmm = vmm_back_suspended(reader.info()); !vmm.ok()) {
      restore::release_pools(backed);
      return refuse(vmm.message());
    }
    if (const status loaded =
            restore::upload(*d, reader, pool_memory_backed(), true, progress, vmm_kept_ranges(), &resume_buffers());
        !loaded.ok()) {
      restore::release_pools(backed);
      vmm_release_physical();
      return refuse(loaded.message());
    }
    bytes = image::restored_bytes(reader.info());
    log::info("resume: physical memory back in {:.3f} s, {} bytes loaded in {:.3f} s",
              std::chrono::duration<double>(loading - start).count(), bytes,
              std::chrono::duration<double>(clock::now() - loading).count());
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  resume_buffers() = host_pages();  // given back: the next suspend sets them aside again
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  log::info("control: resumed; {} bytes back from {} in {:.3f} s", bytes, image, seconds);
  return control::resume_reply{bytes, seconds, image};
}


}  // namespace

std::variant<control::resume_reply, control::failure_reply> resume(const control::resume_request& request,
                                                                   const restore::upload_progress& progress) {
  if (control::unix_ms_now() > request.valid_until_ms)
    return control::failure_reply{control::refusal::expired,
                                  "the resume request arrived after it expired; nothing was done"};
  if (current_state() != process_state::suspended)
    return control::failure_reply{control::refusal::not_suspended,
                                  current_state() == process_state::paused
                                      ? "the program is not suspended: it paused its own GPU memory "
                                        "(vmmckpt_pause) and resumes it itself"
                                      : "the program is not suspended"};
  control::resume_reply loaded{0, 0, suspended_image().image};
  if (request.step != control::resume_request::stage::finish && !g_loaded.load()) {
    enter_state(process_state::restoring);
    auto outcome = load_suspended(request, progress);
    enter_state(process_state::suspended);
    if (std::holds_alternative<control::failure_reply>(outcome)) return outcome;
    loaded = std::get<control::resume_reply>(outcome);
    g_loaded.store(true);
  }
  if (request.step == control::resume_request::stage::load) return loaded;
  if (!g_loaded.load())
    return control::failure_reply{control::refusal::failed,
                                  "the program's memory is not loaded yet: a job's resume loads every rank's first"};
  // A job's rank maps the other ranks' memory again (all of it loaded by now) before it runs: its next
  // collective reads and writes there (docs/job-checkpoint.md).
  if (const status mapped = vmm_map_imports_again(request.ranks); !mapped.ok())
    return control::failure_reply{control::refusal::failed,
                                  "cannot map the other ranks' memory again: " + mapped.message() +
                                      "; the program stays suspended, its memory loaded (resume the whole job: "
                                      "cuda-ckpt resume --job)"};
  g_loaded.store(false);
  job_cut::hold_while_suspended(false);
  enter_state(process_state::running);
  the_gate().open();
  return loaded;
}

bool memory_loaded_while_suspended() noexcept { return g_loaded.load() && current_state() == process_state::suspended; }

bool restore_ready() noexcept {
  const int s = g_state.load(std::memory_order_acquire);
  if (s == nothing_to_restore || s == restored) return true;
  if (s == failed) return false;
  return restore_slow_path();
}

}  // namespace vmmckpt::detail
