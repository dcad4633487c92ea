// The control server: a thread in the program that answers cuda-ckpt over a Unix socket (docs/protocol.md).
#include "control_server.hpp"

#include <nlohmann/json.hpp>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "gate.hpp"
#include "log.hpp"
#include "pools.hpp"
#include "restore_loader.hpp"
#include "real_symbols.hpp"
#include "vmmckpt/pool_layout.hpp"
#include "vmmckpt/protocol.hpp"
#include "vmmckpt/uuid_text.hpp"

namespace vmmckpt::detail {
namespace {

using json = nlohmann::json;
using clock = std::chrono::steady_clock;

constexpr int idle_timeout_ms = 30'000;         // a client that says nothing is dropped

// Only the server thread changes these; hello reports them.
bool g_suspended = false;
std::string g_suspend_image;
constexpr int default_hold_deadline_ms = 60'000;  // longest a dump may hold the program
constexpr int max_hold_deadline_ms = 600'000;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::vector<std::string> command_line() {
  std::vector<std::string> args;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

json device_json(int ordinal) {
  const driver_api* d = driver();
  json dev = {{"ordinal", ordinal}};
  CUdevice device;
  if (d == nullptr || d->cuDeviceGet(&device, ordinal) != CUDA_SUCCESS) return dev;
  char name[256] = {};
  if (d->cuDeviceGetName(name, sizeof name - 1, device) == CUDA_SUCCESS) dev["name"] = name;
  CUuuid uuid{};
  if (d->cuDeviceGetUuid_v2 != nullptr && d->cuDeviceGetUuid_v2(&uuid, device) == CUDA_SUCCESS)
    dev["uuid"] = uuid_text(uuid.bytes);
  int major = 0, minor = 0;
  d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
  d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
  dev["cc_major"] = major;
  dev["cc_minor"] = minor;
  return dev;
}

json hello() {
  json devices = json::array(), pools = json::array();
  for (const auto& p : active_pools()) {
    devices.push_back(device_json(p.ordinal));
    const pool_stats s = p.pool->stats();
    pools.push_back({{"device", p.ordinal},
                     {"base", hex(p.pool->base())},
                     {"size", p.pool->size()},
                     {"live_bytes", s.live_bytes},
                     {"live_count", s.live_count},
                     {"backed_bytes", s.backed_bytes}});
  }
  json out = {{"ok", true},        {"protocol", protocol::version},
              {"pid", static_cast<long>(getpid())},
              {"command", command_line()}, {"state", g_suspended ? "suspended" : "running"},
              {"devices", devices},    {"pools", pools}};
  if (g_suspended) out["image"] = g_suspend_image;
  return out;
}

bool reply(int fd, const json& body, const std::vector<int>& fds = {}) {
  std::string error;
  if (protocol::send_frame(fd, body.dump(), fds, error)) return true;
  log::warn("control: reply failed: {}", error);
  return false;
}

json failure(const std::string& why) { return {{"ok", false}, {"error", why}}; }

// Holds the program for one dump: gate closed, work drained, every pool's
// device synchronized, the pool's handles exported to the client. Returns
// when the client says dump_end, goes away, or the deadline passes; the gate
// is open again in every case.
// Bytes in use on the device now, the program's context and unserved memory
// included (and other processes' too: the driver counts the whole device).
std::uint64_t device_used_bytes(int ordinal) {
  const driver_api* d = driver();
  CUdevice device;
  CUcontext context;
  if (d == nullptr || d->cuDeviceGet(&device, ordinal) != CUDA_SUCCESS ||
      d->cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS || d->cuCtxPushCurrent_v2(context) != CUDA_SUCCESS)
    return 0;
  size_t free_bytes = 0, total = 0;
  d->cuMemGetInfo_v2(&free_bytes, &total);
  CUcontext ignored;
  d->cuCtxPopCurrent_v2(&ignored);
  return total - free_bytes;
}

// The program stays held, its pool's physical memory given back, until resume.
json suspend_now(const json& request, long long held_us) {
  std::uint64_t freed = 0;
  json devices = json::array();
  for (const auto& p : active_pools()) {
    freed += p.pool->release_all_physical();
    devices.push_back({{"device", p.ordinal}, {"used_bytes_after", device_used_bytes(p.ordinal)}});
  }
  g_suspended = true;
  g_suspend_image = request.value("image", "");
  log::info("control: suspended; {} bytes of GPU memory given back; image {}", freed, g_suspend_image);
  return {{"ok", true}, {"freed_bytes", freed}, {"devices", devices}, {"held_us", held_us}};
}

json resume_now() {
  if (!g_suspended) return failure("the program is not suspended");
  const auto start = clock::now();
  std::string error;
  std::uint64_t bytes = 0;
  if (!refill_pools_from_image(g_suspend_image, error, bytes))
    return failure("cannot resume from " + g_suspend_image + ": " + error + "; the program stays suspended");
  g_suspended = false;
  the_gate().open();
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  log::info("control: resumed; {} bytes back from {} in {:.3f} s", bytes, g_suspend_image, seconds);
  return {{"ok", true}, {"bytes", bytes}, {"seconds", seconds}, {"image", g_suspend_image}};
}

void serve_dump(int fd, const json& request) {
  if (g_suspended) {
    reply(fd, failure("the program is suspended (image " + g_suspend_image + "); resume it first"));
    return;
  }
  int deadline_ms = request.value("deadline_ms", default_hold_deadline_ms);
  if (deadline_ms <= 0 || deadline_ms > max_hold_deadline_ms) deadline_ms = default_hold_deadline_ms;
  const auto deadline = clock::now() + std::chrono::milliseconds(deadline_ms);
  work_gate& gate = the_gate();
  const auto hold_start = clock::now();
  if (!gate.close(deadline)) {
    reply(fd, failure("the program did not quiesce within " + std::to_string(deadline_ms) + " ms"));
    return;
  }
  std::vector<int> fds;
  auto release = [&](const char* why) {
    gate.open();
    for (int f : fds) close(f);
    const auto held = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - hold_start).count();
    log::info("control: program released after {} us ({})", held, why);
    return held;
  };

  json pools = json::array();
  const driver_api* d = driver();
  for (const auto& p : active_pools()) {
    p.pool->synchronize();
    json allocations = json::array(), segments = json::array();
    for (const auto& b : p.pool->live_blocks())
      allocations.push_back({{"addr", hex(b.addr)}, {"size", b.requested}, {"api", name_of(static_cast<alloc_api>(b.tag))}});
    std::uint64_t granularity = 0;
    for (const auto& s : p.pool->segments()) {
      int exported = -1;
      const CUresult e = d->cuMemExportToShareableHandle(&exported, s.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (e != CUDA_SUCCESS) {
        release("export failed");
        reply(fd, failure("exporting pool memory at " + hex(s.addr) + " failed: CUDA error " + std::to_string(e)));
        return;
      }
      fds.push_back(exported);
      segments.push_back({{"addr", hex(s.addr)}, {"size", s.size}});
      if (granularity == 0 || s.size < granularity) granularity = s.size;
    }
    pools.push_back({{"device", p.ordinal},
                     {"base", hex(p.pool->base())},
                     {"size", p.pool->size()},
                     {"granularity", large_alignment},
                     {"allocations", allocations},
                     {"segments", segments}});
  }
  // Several frames when there are more descriptors than one may carry.
  const std::size_t first = std::min<std::size_t>(fds.size(), protocol::max_fds_per_message);
  json response = {{"ok", true}, {"pools", pools}, {"devices", json::array()}, {"fd_count", fds.size()}};
  for (const auto& p : active_pools()) response["devices"].push_back(device_json(p.ordinal));
  bool sent = reply(fd, response, {fds.begin(), fds.begin() + static_cast<long>(first)});
  for (std::size_t i = first; sent && i < fds.size(); i += protocol::max_fds_per_message) {
    const std::size_t n = std::min<std::size_t>(fds.size() - i, protocol::max_fds_per_message);
    sent = reply(fd, {{"op", "fds"}, {"count", n}},
                 {fds.begin() + static_cast<long>(i), fds.begin() + static_cast<long>(i + n)});
  }
  for (int f : fds) close(f);  // the client has its own copies now
  fds.clear();
  if (!sent) {
    release("client gone before the handles were sent");
    return;
  }

  // Held until the client is done copying out of the GPU.
  std::string payload, error;
  std::vector<int> ignored;
  const int left_ms = static_cast<int>(
      std::max<long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count()));
  if (!protocol::recv_frame(fd, payload, ignored, left_ms, error)) {
    for (int f : ignored) close(f);
    release(error == "timed out" ? "deadline passed" : "client went away");
    return;
  }
  for (int f : ignored) close(f);
  json end = json::parse(payload, nullptr, false);
  const std::string op = end.is_object() ? end.value("op", "") : "";
  if (op == "suspend") {
    // The gate stays closed: threads that call CUDA wait until resume.
    const auto held = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - hold_start).count();
    reply(fd, suspend_now(end, held));
    return;
  }
  const auto held = release("dump finished");
  if (op != "dump_end") {
    reply(fd, failure("expected dump_end or suspend"));
    return;
  }
  reply(fd, {{"ok", true}, {"held_us", held}});
}

void serve_client(int fd) {
  for (;;) {
    std::string payload, error;
    std::vector<int> fds;
    if (!protocol::recv_frame(fd, payload, fds, idle_timeout_ms, error)) {
      for (int f : fds) close(f);
      if (error.rfind("connection closed", 0) != 0) log::debug("control: {}", error);
      return;
    }
    for (int f : fds) close(f);  // clients send none
    const json request = json::parse(payload, nullptr, false);
    const std::string op = request.is_object() ? request.value("op", "") : "";
    if (op == "hello") {
      if (!reply(fd, hello())) return;
    } else if (op == "dump_begin") {
      serve_dump(fd, request);
    } else if (op == "check") {
      json problems = json::array();
      for (const auto& p : active_pools())
        if (std::string why = p.pool->check_invariants(); !why.empty())
          problems.push_back("device " + std::to_string(p.ordinal) + ": " + why);
      if (!reply(fd, {{"ok", true}, {"consistent", problems.empty()}, {"problems", problems}})) return;
    } else if (op == "resume") {
      if (!reply(fd, resume_now())) return;
    } else if (op == "dump_end") {
      if (!reply(fd, failure("no dump in progress: the program was already released (the hold deadline passed)")))
        return;
    } else {
      if (!reply(fd, failure("unknown op '" + op + "'"))) return;
    }
  }
}

void serve(int listener) {
  for (;;) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      log::warn("control: accept failed ({}); the control server stops", errno);
      return;
    }
    uid_t uid = 0;
    pid_t pid = 0;
    if (!protocol::peer_allowed(fd, uid, pid)) {
      log::warn("control: refused a connection from uid {} (pid {}): only the same user or root may connect", uid, pid);
      close(fd);
      continue;
    }
    try {
      serve_client(fd);
    } catch (...) {
      if (!g_suspended) the_gate().open();  // never leave a running program held
      log::warn("control: a request failed unexpectedly");
    }
    close(fd);
  }
}

std::string g_socket_path;

void remove_socket() {
  if (!g_socket_path.empty()) unlink(g_socket_path.c_str());
}

}  // namespace

void start_control_server() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::string error;
    if (!protocol::ensure_runtime_dir(error)) {
      log::warn("control: no control socket ({}); cuda-ckpt cannot reach this process", error);
      return;
    }
    const std::string path = protocol::socket_path(getpid());
    const int listener = protocol::listen_at(path, error);
    if (listener < 0) {
      log::warn("control: cannot listen at {} ({}); cuda-ckpt cannot reach this process", path, error);
      return;
    }
    g_socket_path = path;
    std::atexit(remove_socket);
    // The server thread takes no signals: they stay the program's.
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pthread_t thread;
    const int started = pthread_create(
        &thread, nullptr,
        [](void* arg) -> void* {
          serve(static_cast<int>(reinterpret_cast<std::intptr_t>(arg)));
          return nullptr;
        },
        reinterpret_cast<void*>(static_cast<std::intptr_t>(listener)));
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    if (started != 0) {
      log::warn("control: cannot start the server thread ({})", started);
      close(listener);
      unlink(path.c_str());
      return;
    }
    pthread_detach(thread);
    log::info("control: listening at {}", path);
  });
}

}  // namespace vmmckpt::detail
