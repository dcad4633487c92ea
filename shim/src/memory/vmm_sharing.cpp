// Program-made VMM memory shared between processes: the FDs given out and who imported them, and on the
// importing side, asking their exporter which handle they are.
#include "memory/vmm_sharing.hpp"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <mutex>

#include "memory/peer_requests.hpp"
#include "memory/devices.hpp"
#include "core/real_symbols.hpp"
#include "memory/pools.hpp"
#include "memory/vmm_state.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/log.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::detail {
namespace {

// NCCL asks its peer for a new FD of a buffer each time it imports one, and imports it at once: a few dozen
// FDs kept cover every import in flight, and bound what the program's descriptor table pays for it.
constexpr std::size_t max_exported = 64;
constexpr int identify_timeout_ms = 10'000;
constexpr int unshare_timeout_ms = 2'000;

struct exported_fd {
  std::uint64_t token;
  int fd;  // our duplicate: the same open file as the FD given out
};
struct importer_record {
  pid_t pid;
  std::uint64_t start;
  std::uint64_t token;
};

struct sharing_table {
  std::mutex mutex;                  // taken after vmm_state's mutex, never before it
  std::deque<exported_fd> exported;  // oldest first
  std::vector<importer_record> importers;
};

sharing_table& table() {
  static sharing_table* t = new sharing_table;  // never destroyed: exports may come at exit
  return *t;
}

// Whether two descriptors of this process are the same open file. kcmp says so exactly; where it is not
// allowed (a container's seccomp policy), the file's identity decides when it names one candidate only
// (the emulator's memfds are distinct files; the driver's FDs all open /dev/nvidiactl).
enum class same { yes, no, unknown };
same same_open_file(int a, int b) {
  const long r = ::syscall(SYS_kcmp, ::getpid(), ::getpid(), KCMP_FILE, a, b);
  if (r == 0) return same::yes;
  if (r > 0) return same::no;
  return same::unknown;
}

bool same_inode(int a, int b) {
  struct stat x {
  }, y{};
  return ::fstat(a, &x) == 0 && ::fstat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

// The token of the FD given out that `fd` is, taken off the list (each FD is imported once); 0 when none.
std::uint64_t take_exported(sharing_table& t, int fd) {
  auto match = t.exported.end();
  bool kcmp_failed = false;
  for (auto it = t.exported.begin(); it != t.exported.end(); ++it) {
    const same s = same_open_file(fd, it->fd);
    if (s == same::yes) {
      match = it;
      break;
    }
    kcmp_failed = kcmp_failed || s == same::unknown;
  }
  if (match == t.exported.end() && kcmp_failed) {
    std::size_t found = 0;
    for (auto it = t.exported.begin(); it != t.exported.end(); ++it)
      if (same_inode(fd, it->fd) && found++ == 0) match = it;
    if (found != 1) match = t.exported.end();
  }
  if (match == t.exported.end()) return 0;
  const std::uint64_t token = match->token;
  ::close(match->fd);
  t.exported.erase(match);
  return token;
}

void add_importer(std::uint64_t token, pid_t pid) {
  if (pid == ::getpid()) return;  // this process's own memory, imported by itself: nothing to refuse
  sharing_table& t = table();
  const std::uint64_t start = suspend_claim::start_time(pid);
  std::lock_guard lock(t.mutex);
  for (const auto& r : t.importers)
    if (r.pid == pid && r.start == start && r.token == token) return;
  t.importers.push_back({pid, start, token});
}

// The reply naming `token`: its size and the GPU its memory is on. Under vmm_state's mutex.
std::variant<control::vmm_share_reply, control::failure_reply> describe_handle(vmm_state& s, std::uint64_t token) {
  const vmm_handle* h = s.registry.live_handle(token);
  if (h == nullptr)
    return control::failure_reply{control::refusal::failed, "VMM handle " + hex(token) + " is no live handle here"};
  control::vmm_share_reply reply{token, h->size, {}};
  if (!host_located(*h)) reply.device_uuid = describe_device(h->device).uuid;
  return reply;
}

}  // namespace

void note_export(std::uint64_t token, int fd) noexcept {
  // Marks the open file with this pid, so that the importer finds the process to ask. No O_ASYNC is set:
  // no signal is ever sent for it.
  ::fcntl(fd, F_SETOWN, ::getpid());
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (dup < 0) return;
  try {
    sharing_table& t = table();
    std::lock_guard lock(t.mutex);
    if (t.exported.size() >= max_exported) {
      ::close(t.exported.front().fd);
      t.exported.pop_front();
    }
    t.exported.push_back({token, dup});
  } catch (...) {
    ::close(dup);
  }
}

std::variant<control::vmm_share_reply, control::failure_reply> identify_export(int fd, pid_t importer) {
  std::uint64_t token = 0;
  {
    sharing_table& t = table();
    std::lock_guard lock(t.mutex);
    token = take_exported(t, fd);
  }
  if (token == 0)
    return control::failure_reply{control::refusal::failed, "the descriptor is no VMM handle this process gave out"};
  vmm_state* s = existing_vmm_state();
  if (s == nullptr) return control::failure_reply{control::refusal::failed, "this process has no VMM memory"};
  auto reply = [&] {
    std::lock_guard lock(s->mutex);
    return describe_handle(*s, token);
  }();
  if (std::holds_alternative<control::vmm_share_reply>(reply)) add_importer(token, importer);
  log::info("vmm: process {} imported handle {}", importer, hex(token));
  return reply;
}

std::variant<control::vmm_share_reply, control::failure_reply> share_handle(std::uint64_t token, pid_t importer,
                                                                            std::vector<int>& fds) {
  vmm_state* s = existing_vmm_state();
  const driver_api* d = driver();
  if (s == nullptr || d == nullptr)
    return control::failure_reply{control::refusal::failed, "this process has no VMM memory"};
  std::lock_guard lock(s->mutex);
  auto reply = describe_handle(*s, token);
  if (!std::holds_alternative<control::vmm_share_reply>(reply)) return reply;
  const vmm_handle* h = s->registry.live_handle(token);
  if (h->real == 0)
    return control::failure_reply{control::refusal::suspended, "the program's GPU memory is given back (suspended)"};
  int fd = -1;
  if (const CUresult e = d->cuMemExportToShareableHandle(&fd, h->real, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      e != CUDA_SUCCESS)
    return control::failure_reply{control::refusal::failed,
                                  "exporting VMM handle " + hex(token) + " failed: CUDA error " + std::to_string(e)};
  fds.push_back(fd);
  add_importer(token, importer);
  return reply;
}

void unshare_handle(std::uint64_t token, pid_t importer) noexcept {
  try {
    sharing_table& t = table();
    std::lock_guard lock(t.mutex);
    std::erase_if(t.importers, [&](const importer_record& r) { return r.pid == importer && r.token == token; });
  } catch (...) {
    // No memory for the table: nobody was recorded in it.
  }
}

void forget_exports() noexcept {
  sharing_table& t = table();
  std::lock_guard lock(t.mutex);
  for (const exported_fd& e : t.exported) ::close(e.fd);
  t.exported.clear();
}

std::vector<pid_t> vmm_importers() {
  sharing_table& t = table();
  std::lock_guard lock(t.mutex);
  std::erase_if(t.importers, [](const importer_record& r) { return !suspend_claim::alive(r.pid, r.start); });
  std::vector<pid_t> pids;
  for (const auto& r : t.importers)
    if (std::find(pids.begin(), pids.end(), r.pid) == pids.end()) pids.push_back(r.pid);
  return pids;
}

std::optional<vmm_import> identify_import(int fd) noexcept {
  try {
    const pid_t owner = ::fcntl(fd, F_GETOWN);
    if (owner <= 0) return std::nullopt;
    std::variant<control::vmm_share_reply, control::failure_reply> reply;
    if (owner == ::getpid()) {
      reply = identify_export(fd, owner);
    } else {
      std::vector<int> fds;
      bool gone = false;
      const auto payload = ask_process(owner, control::vmm_identify_request{}, {fd}, identify_timeout_ms, fds, gone);
      protocol::close_all(fds);
      if (!payload) return std::nullopt;
      reply = control::decode_reply<control::vmm_share_reply>(*payload);
    }
    const auto* r = std::get_if<control::vmm_share_reply>(&reply);
    if (r == nullptr) {
      log::info("vmm: process {} did not say which handle an imported FD is: {}", owner,
                std::get<control::failure_reply>(reply).error);
      return std::nullopt;
    }
    vmm_import x;
    x.exporter_pid = owner;
    x.exporter_start = suspend_claim::start_time(owner);
    x.token = r->token;
    x.handle_size = r->size;
    x.device_uuid = r->device_uuid;
    return x;
  } catch (const std::exception& e) {
    log::info("vmm: identifying an imported FD: {}", e.what());
    return std::nullopt;
  }
}

void tell_unshared(const std::vector<vmm_import>& dropped) noexcept {
  for (const vmm_import& x : dropped) {
    if (x.exporter_pid == ::getpid()) continue;
    try {
      std::vector<int> fds;
      bool gone = false;
      ask_process(static_cast<pid_t>(x.exporter_pid), control::vmm_unshare_request{x.token}, {}, unshare_timeout_ms,
                  fds, gone);
      protocol::close_all(fds);
    } catch (...) {
    }
  }
}

status import_again(const vmm_import& x, CUmemGenericAllocationHandle& real,
                    const std::vector<std::int64_t>& job_ranks) noexcept {
  try {
    const driver_api* d = driver();
    if (d == nullptr) return status(CUDA_ERROR_NOT_INITIALIZED, "no CUDA driver");
    const auto pid = static_cast<pid_t>(x.exporter_pid);
    const bool in_job = std::find(job_ranks.begin(), job_ranks.end(), x.exporter_pid) != job_ranks.end();
    if (in_job ? suspend_claim::start_time(pid) == 0 : !suspend_claim::alive(pid, x.exporter_start))
      return status(CUDA_ERROR_INVALID_HANDLE, "process " + std::to_string(pid) + " that exported it is gone");
    std::vector<int> fds;
    bool gone = false;
    const auto payload = ask_process(pid, control::vmm_share_request{x.token}, {}, identify_timeout_ms, fds, gone);
    if (!payload) {
      protocol::close_all(fds);
      return status(CUDA_ERROR_INVALID_HANDLE, "process " + std::to_string(pid) + " did not answer");
    }
    const auto reply = control::decode_reply<control::vmm_share_reply>(*payload);
    if (const auto* refused = std::get_if<control::failure_reply>(&reply); refused != nullptr || fds.size() != 1) {
      protocol::close_all(fds);
      return status(CUDA_ERROR_INVALID_HANDLE, "process " + std::to_string(pid) +
                                                   " refused: " + (refused ? refused->error : "no descriptor sent"));
    }
    if (const auto& shared = std::get<control::vmm_share_reply>(reply);
        shared.size != x.handle_size || shared.device_uuid != x.device_uuid) {
      protocol::close_all(fds);
      return status(CUDA_ERROR_INVALID_HANDLE, "process " + std::to_string(pid) + "'s handle " + hex(x.token) +
                                                   " is not the memory recorded (its size or GPU differ)");
    }
    const CUresult e = d->cuMemImportFromShareableHandle(
        &real, reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[0])), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    protocol::close_all(fds);
    if (e != CUDA_SUCCESS) return status(e, "importing it failed: CUDA error " + std::to_string(e));
    return {};
  } catch (const std::exception& e) {
    return status(CUDA_ERROR_OUT_OF_MEMORY, e.what());
  }
}

}  // namespace vmmckpt::detail
