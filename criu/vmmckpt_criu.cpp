// vmmckpt_criu.so: CRIU's device plugin for processes under the shim (docs/containers.md). With it, a plain
// `criu dump` / `criu restore` (a container runtime's) takes each such process's GPU side through vmmckpt's
// path: its GPU memory suspended into the images directory, its context checkpointed by the driver, and back.
//
// The hooks are thin: each calls what `cuda-ckpt dump --process` and `restore DIR` do to one process
// (vmmckpt/ckpt/gpu_side.hpp). A process not under the shim is left to other plugins (-ENOTSUP).
//
// CRIU calls PAUSE_DEVICES before it freezes a task, which is when the shim's control server can still
// answer: the whole GPU side is done there. Bringing a process back needs its threads running (the shim
// loads its memory itself, and the driver restores a context through the process's own thread), and CRIU
// runs the late restore hook, and the end of a dump that leaves the processes alive, while they are still
// stopped under ptrace. So those steps are handed to a helper process that waits until CRIU has let the
// process go, then restores it: meanwhile its CUDA calls wait (the driver's lock, the shim's gate).
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "criu_plugin_abi.hpp"
#include "vmmckpt/ckpt/dump.hpp"
#include "vmmckpt/ckpt/gpu_side.hpp"
#include "vmmckpt/restore/tool/process_restore.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/support/fault_point.hpp"

namespace fs = std::filesystem;

namespace {

// The processes whose GPU side this dump suspended (pid order of the hooks).
std::vector<int> g_paused;
bool g_pre_dump = false;

constexpr auto hold_deadline = std::chrono::milliseconds(120'000);
// How long a helper waits for CRIU to let a process go before it gives up on it.
constexpr auto release_wait = std::chrono::minutes(10);

// Into CRIU's log, as "vmmckpt_criu: ..." (a refusal at error level, the rest at info).
template <typename... Args>
void say_at(unsigned level, const char* format, Args... args) {
  char text[2048];
  std::snprintf(text, sizeof text, format, args...);
  print_on_level(level, "vmmckpt_criu: %s\n", text);
}
template <typename... Args>
void say(const char* format, Args... args) {
  say_at(3, format, args...);
}

// Where the GPU part of `pid` lies in the images directory of the dump or restore under way, named by its
// pid in its own namespace, so that a container restored with new pids on the host finds its part.
fs::path gpu_part(int pid) {
  const int dir = criu_get_image_dir();
  std::error_code ec;
  const fs::path images = fs::read_symlink("/proc/self/fd/" + std::to_string(dir), ec);
  return images / "vmmckpt" / std::to_string(vmmckpt::ckpt::pid_in_own_namespace(pid));
}

// The sockets `pid` has open (the targets of /proc/PID/fd that name one).
std::set<std::string> sockets_of(int pid) {
  std::set<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code rc;
    const std::string target = fs::read_symlink(it->path(), rc).string();
    if (!rc && target.rfind("socket:", 0) == 0) out.insert(target);
  }
  return out;
}

// Waits until `pid` has closed every socket it holds that is not in `before`: the shim closes its end of a
// control connection only after ours is closed, and CRIU must not find it open. A connection from the host
// into a container belongs to the host's network namespace, which CRIU does not dump: it would fail the dump
// ("Unix socket ... not found"). Gives up after a few seconds (a socket the program opened itself meanwhile).
void wait_connections_closed(int pid, const std::set<std::string>& before) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    const auto now = sockets_of(pid);
    if (std::includes(before.begin(), before.end(), now.begin(), now.end())) return;
    if (std::chrono::steady_clock::now() > until) {
      say_at(2, "process %d: a socket opened during its suspend is still open; CRIU dumps it as it is", pid);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// What /proc says of a process: gone (or a zombie), stopped or traced (CRIU still holds it), or running.
enum class task { gone, held, running };
task task_state(int pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  char state = 0;
  long tracer = 0;
  bool seen = false;
  while (std::getline(status, line)) {
    if (line.rfind("State:", 0) == 0) {
      const auto at = line.find_first_not_of(" \t", 6);
      if (at != std::string::npos) state = line[at];
      seen = true;
    } else if (line.rfind("TracerPid:", 0) == 0) {
      tracer = std::strtol(line.c_str() + 10, nullptr, 10);
    }
  }
  if (!seen || state == 'Z' || state == 'X') return task::gone;
  return tracer != 0 || state == 't' || state == 'T' ? task::held : task::running;
}

// A process that cannot get its GPU memory back must not run on without it (its CUDA calls would wait for good):
// it is ended, and the reason goes to a log in /tmp that names it.
void end_without_gpu(int pid, const std::string& why) {
  ::kill(pid, SIGKILL);
  const std::string log = "/tmp/vmmckpt-criu-" + std::to_string(pid) + ".log";
  std::ofstream(log) << "vmmckpt_criu: process " << pid << " could not get its GPU memory back (" << why
                     << "); it was ended\n";
}

// Whether the process, running again, says it is suspended: it waits for GPU memory from a part of ours.
bool waits_for_gpu_memory(int pid) {
  try {
    const auto entries = vmmckpt::ckpt::list_processes(pid, std::chrono::milliseconds(10'000));
    return !entries.empty() && entries.front().hello &&
           entries.front().hello->state == vmmckpt::control::process_state::suspended;
  } catch (const std::exception&) {
    return false;  // no control server (it never used CUDA), or not under the shim: nothing of ours to give back
  }
}

// In a helper, detached from CRIU: waits until CRIU lets each process go, then brings its GPU side back
// from its part (`parts[i]`, or where its suspend wrote it when empty). A part that is missing is needed only by
// a process that says it is suspended; one that never used CUDA has none.
void bring_back_later(const std::vector<int>& pids, const std::vector<fs::path>& parts) {
  const pid_t helper = ::fork();
  if (helper != 0) {
    if (helper > 0) ::waitpid(helper, nullptr, 0);  // the first child exits at once: no zombie is left to CRIU
    return;
  }
  if (::fork() != 0) ::_exit(0);
  ::setsid();
  // Nothing of CRIU's stays open here: a runtime that waits for the end of CRIU's output or log must not
  // wait for this helper.
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0)
    for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
  ::close_range(3, ~0U, 0);
  for (std::size_t i = 0; i < pids.size(); ++i) {
    const auto until = std::chrono::steady_clock::now() + release_wait;
    task t = task_state(pids[i]);
    for (; t == task::held && std::chrono::steady_clock::now() < until; t = task_state(pids[i]))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (t == task::gone) continue;  // CRIU ended it (a dump without --leave-running): its part stays
    std::string why = t == task::held ? "CRIU still holds it after 10 minutes" : "";
    std::error_code ec;
    if (why.empty() && !parts[i].empty() && !fs::exists(fs::symlink_status(parts[i], ec))) {
      if (!waits_for_gpu_memory(pids[i])) continue;
      why = "its GPU part " + parts[i].string() + " is missing";
    }
    if (why.empty()) {
      try {
        vmmckpt::restore::restore_gpu_side(pids[i], parts[i]);
        continue;
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    end_without_gpu(pids[i], why);
  }
  ::_exit(0);
}

int init(int stage) {
  g_paused.clear();
  g_pre_dump = stage == criu_stage_pre_dump;  // a pre-dump copies memory only: the GPU side waits for the dump
  return 0;
}

// A dump that failed, or that leaves the processes running (--leave-running): each paused process gets
// its GPU side back once CRIU lets it go. After a dump that ended them, the helper finds them gone.
void fini(int stage, int ret) {
  if (stage != criu_stage_dump || g_paused.empty()) return;
  say("dump done (%d): %zu process(es) get their GPU memory back if they go on", ret, g_paused.size());
  bring_back_later(g_paused, std::vector<fs::path>(g_paused.size()));
  g_paused.clear();
}

int pause_devices(int pid) {
  if (g_pre_dump) return -ENOTSUP;
  const std::set<std::string> sockets_before = sockets_of(pid);  // before the first connection of ours
  try {
    if (!vmmckpt::ckpt::has_gpu_side(pid)) return -ENOTSUP;
  } catch (const std::exception& e) {
    say_at(1, "process %d: %s", pid, e.what());
    return -1;  // CRIU rolls the dump back; the process runs on with its memory
  }
  const fs::path part = gpu_part(pid);
  try {
    std::error_code ec;
    fs::create_directories(part.parent_path(), ec);
    // A part left in this images directory by an earlier dump (Podman checkpoints a container into the same
    // directory again after a restore that kept it): CRIU overwrites its own images there, and so do we, once
    // the process runs with its memory (a process that still loads its memory from the part keeps it).
    if (fs::exists(part, ec)) {
      const auto entries = vmmckpt::ckpt::list_processes(pid);
      if (entries.empty() || entries.front().status != "running")
        throw std::runtime_error(part.string() + " exists and the process is not running with its memory (" +
                                 (entries.empty() ? std::string("no answer") : entries.front().status) + ")");
      say("process %d: replacing %s, left by an earlier dump", pid, part.c_str());
      fs::remove_all(part);
    }
    const auto s = vmmckpt::ckpt::checkpoint_gpu_side(pid, part, hold_deadline);
    wait_connections_closed(pid, sockets_before);
    g_paused.push_back(pid);
    say("process %d: %llu bytes of GPU memory suspended into %s, its context checkpointed by the driver", pid,
        static_cast<unsigned long long>(s.manifest.data_bytes), part.c_str());
    return 0;
  } catch (const std::exception& e) {
    say_at(1, "process %d: %s", pid, e.what());
    return -1;  // CRIU rolls the dump back; the process runs on with its memory
  }
}

// The GPU side was done when the task was paused; this hook only claims the processes that are ours.
int checkpoint_devices(int pid) {
  for (const int p : g_paused)
    if (p == pid) return vmmckpt::fault_point("criu-plugin:checkpoint") ? -1 : 0;  // the tests fail a dump here
  return -ENOTSUP;
}

// Why the GPU part at `part` cannot be read as one (not a directory, unreadable), "" when it can; `missing` when
// nothing is there.
std::string part_problem(const fs::path& part, bool& missing) {
  struct stat st {};
  if (::lstat(part.c_str(), &st) != 0) {
    missing = errno == ENOENT;
    return missing ? "" : "its GPU part " + part.string() + " cannot be looked at: " + std::strerror(errno);
  }
  if (::stat(part.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return "its GPU part " + part.string() + " is not a directory" + (S_ISREG(st.st_mode) ? " (a regular file)" : "");
  if (::access(part.c_str(), R_OK | X_OK) != 0)
    return "its GPU part " + part.string() + " cannot be read: " + std::strerror(errno);
  return {};
}

int resume_devices_late(int pid) {
  if (vmmckpt::ckpt::shim_in(pid) != vmmckpt::ckpt::shim_presence::loaded) return -ENOTSUP;  // another plugin's
  const fs::path part = gpu_part(pid);
  bool missing = false;
  if (const std::string problem = part_problem(part, missing); !problem.empty()) {
    // Something stands where its part should be: the process waits for memory it can never get.
    say_at(1, "process %d: %s", pid, problem.c_str());
    end_without_gpu(pid, problem);
    return -1;
  }
  // Missing, the part may never have been (a process that never used CUDA): the process says so once it runs.
  if (missing)
    say("process %d: no GPU part at %s; it is ended if it turns out to be suspended", pid, part.c_str());
  else
    say("process %d: its GPU memory comes back from %s once CRIU lets it go", pid, part.c_str());
  bring_back_later({pid}, {part});
  return 0;
}

}  // namespace

extern "C" {

// The descriptor CRIU looks up in every plugin it loads.
__attribute__((visibility("default"))) criu_plugin_desc CR_PLUGIN_DESC = [] {
  criu_plugin_desc d{};
  d.name = "vmmckpt";
  d.init = init;
  d.exit = fini;
  d.version = criu_plugin_version;
  d.max_hooks = criu_hook_count;
  d.hooks[criu_hook_pause_devices] = reinterpret_cast<void*>(&pause_devices);
  d.hooks[criu_hook_checkpoint_devices] = reinterpret_cast<void*>(&checkpoint_devices);
  d.hooks[criu_hook_resume_devices_late] = reinterpret_cast<void*>(&resume_devices_late);
  return d;
}();

}  // extern "C"
