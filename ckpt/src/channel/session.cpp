// One connection to a process under the shim, for one operation: its hello, and this tool's CUDA view of its devices.
#include "channel/session.hpp"

#include "base/cuda_check.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/support/uuid_text.hpp"
#include "vmmckpt/support/version.hpp"
#include "vmmckpt/ckpt/errors.hpp"

#include <unistd.h>

#include <ctime>

namespace vmmckpt::ckpt {
std::string now_iso8601() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

namespace {

// A process stopped by a signal cannot answer until it is continued: refused at once, rather than waited for until
// the operation's deadline.
pid_t not_stopped(pid_t pid, const char* what) {
  if (process_stopped(pid)) throw tool_error(stopped_refusal(pid, std::string(what) + " again"));
  return pid;
}

}  // namespace

session::session(pid_t pid, expect state, const char* what, deadline until)
    : client_(not_stopped(pid, what), until), hello_(client_.hello(state == expect::running)) {
  fault_point("connected");
  const std::string who = "process " + std::to_string(pid);
  if (hello_.protocol != protocol::version)
    throw tool_error(who + " speaks protocol " + std::to_string(hello_.protocol) + "; this cuda-ckpt speaks " +
                     std::to_string(protocol::version));
  if (hello_.state == control::process_state::paused)
    throw tool_error(who + " has paused its own GPU memory (vmmckpt_pause) and resumes it itself: nothing to " + what +
                     " until it does");
  const bool suspended = hello_.state == control::process_state::suspended;
  if (state == expect::running && suspended)
    throw tool_error(who + " is " + (std::string(what) == "suspend" ? "already suspended" : "suspended") + " (image " +
                     hello_.image + ")" + (std::string(what) == "suspend" ? "" : "; resume it first"));
  if (state == expect::suspended && !suspended)
    throw tool_error(who + " is not suspended (state " + std::string(control::name_of(hello_.state)) + ")");
}

void session::describe_process(image::manifest& m) const {
  m.tool_version = VMMCKPT_VERSION;
  m.created = now_iso8601();
  m.host = hostname();
  m.pid = pid();
  m.command = hello_.command;
}

std::uint64_t session::live_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& p : hello_.pools) bytes += p.live_bytes;
  return bytes;
}

device_description session::describe(int ordinal, const std::vector<device_description>& known) {
  for (const auto& d : known)
    if (d.ordinal == ordinal) return d;
  device_description d;
  d.ordinal = ordinal;
  return d;
}

CUcontext session::open_context() {
  const driver_api& d = driver();
  VMMCKPT_CUDA_TRY(d.cuInit(0));
  if (hello_.pools.empty()) throw tool_error("process " + std::to_string(pid()) + " has no GPU memory in the pool yet");
  CUcontext context = nullptr;
  VMMCKPT_CUDA_TRY(
      d.cuDevicePrimaryCtxRetain(&context, device_for(describe(hello_.pools.front().device, hello_.devices))));
  VMMCKPT_CUDA_TRY(d.cuCtxSetCurrent(context));
  for (const auto& p : hello_.pools) device_for(describe(p.device, hello_.devices));
  return context;
}

CUdevice session::device_for(const device_description& d) {
  if (auto it = devices_.find(d.ordinal); it != devices_.end()) return it->second;
  const driver_api& api = driver();
  int count = 0;
  VMMCKPT_CUDA_TRY(api.cuDeviceGetCount(&count));
  for (int i = 0; i < count && !d.uuid.empty(); ++i) {
    CUdevice device;
    VMMCKPT_CUDA_TRY(api.cuDeviceGet(&device, i));
    CUuuid u{};
    // Optional in the table: without it, matched by ordinal below.
    if (api.cuDeviceGetUuid_v2 == nullptr || api.cuDeviceGetUuid_v2(&u, device) != CUDA_SUCCESS) continue;
    if (d.uuid == uuid_text(u.bytes)) return devices_[d.ordinal] = device;
  }
  if (d.ordinal >= count)
    throw tool_error("the program's device " + std::to_string(d.ordinal) + " is not visible here");
  CUdevice device;
  VMMCKPT_CUDA_TRY(api.cuDeviceGet(&device, d.ordinal));
  return devices_[d.ordinal] = device;
}

void record_memory_not_held(const session& s, const control::dump_begin_reply& held, bool allow_partial,
                            image::manifest& m) {
  m.ipc_imports = held.ipc_imports;
  std::vector<image::lack> lacking;
  std::string listed;
  for (const auto& m : held.not_owned) {
    lacking.push_back({m.kind, m.bytes});
    listed += (listed.empty() ? "" : ", ") + m.kind + " " + std::to_string(m.bytes) + " bytes";
  }
  if (!lacking.empty() && !allow_partial)
    throw partial_refused("process " + std::to_string(s.pid()) + " has device memory that vmmckpt does not own (" +
                              listed + "), which no image would hold: nothing was written and the program goes on",
                          s.pid(), held.not_owned);
  m.lacking = std::move(lacking);
}

std::chrono::milliseconds hold_budget(session& s, std::chrono::milliseconds hold_deadline) {
  constexpr int least_ms = 100;
  const int left = s.client().remaining_ms();
  if (left < least_ms)
    throw tool_error("the deadline (" +
                     std::to_string(std::chrono::duration_cast<std::chrono::seconds>(hold_deadline).count()) +
                     " s, --deadline) passed while preparing (connecting, making the CUDA context, pinning staging "
                     "memory): the program was not held");
  return std::chrono::milliseconds(left);
}

}  // namespace vmmckpt::ckpt
