// Finding and running CRIU (4.0 or later) for the whole-process mode.
#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/errors.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace vmmckpt::ckpt {
namespace {

constexpr const char* how_to_get =
    "CRIU 4.0 or later is needed for whole-process checkpoints (provision-criu.sh, installed in share/vmmckpt "
    "beside cuda-ckpt's bin/ and in the source tree's scripts/, provisions it on Debian 12 without touching the "
    "system; point VMMCKPT_CRIU at the criu it prints, or put it on PATH)";

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// `child` and its children (CRIU under the shell that records its status), from /proc.
std::vector<pid_t> with_children(pid_t child) {
  std::vector<pid_t> out{child};
  std::ifstream in("/proc/" + std::to_string(child) + "/task/" + std::to_string(child) + "/children");
  for (long pid; in >> pid;) out.push_back(static_cast<pid_t>(pid));
  return out;
}

bool stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T';
}

// Waits for `child`, looking after it every 100 ms: nothing should stop CRIU (a stop signal seen in long chaos
// runs left it waiting for good), so a CRIU stopped for 2 s is continued; and when `abandon` says so (what it
// works on is gone), it is killed with its process group.
int wait_watching(pid_t child, const std::function<bool()>& abandon) {
  int status = 0, stopped_for = 0;
  bool killed = false;
  for (;;) {
    const pid_t r = ::waitpid(child, &status, WNOHANG);
    if (r == child) break;
    if (r < 0 && errno != EINTR) return 128 + SIGKILL;
    ::usleep(100'000);
    bool any_stopped = false;
    for (const pid_t p : with_children(child)) any_stopped = any_stopped || stopped(p);
    stopped_for = any_stopped ? stopped_for + 1 : 0;
    if (stopped_for >= 20) {
      ::kill(-child, SIGCONT);
      stopped_for = 0;
    }
    if (!killed && abandon && abandon()) {
      ::kill(-child, SIGKILL);
      killed = true;
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs argv with stdout and stderr into `output` (a file), stdin from /dev/null; returns the status.
int spawn_and_wait(const std::vector<std::string>& argv, const std::string& output,
                   const std::function<void(pid_t)>& started = {}, const std::function<bool()>& abandon = {}) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // A process group of its own: Ctrl-C at the terminal reaches cuda-ckpt, which stops between steps, and
  // not CRIU, which killed midway may leave a process it was dumping with its code injected.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  pid_t child = 0;
  const int failed = ::posix_spawn(&child, args[0], &actions, &attributes, args.data(), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0) throw criu_unavailable(argv[0] + ": cannot be started: " + std::strerror(failed));
  if (started) started(child);
  const int status = wait_watching(child, abandon);
  // What is left of its process group: helpers CRIU forks to probe the kernel (one stops itself, one sleeps)
  // outlive a CRIU that was killed, for good. (The group is CRIU's own: what it restores or dumps is not in it.)
  if (status >= 128) ::kill(-child, SIGKILL);
  return status;
}

}  // namespace

void add_tcp_established(std::vector<std::string>& args) {
  const auto has = [&](std::string_view flag) {
    return std::any_of(args.begin(), args.end(), [&](const std::string& a) { return a.rfind(flag, 0) == 0; });
  };
  if (!has(criu_tcp_established)) args.emplace_back(criu_tcp_established);
  if (!has("--network-lock") && find_on_path("iptables-restore").empty())
    args.insert(args.end(), {"--network-lock", "nftables"});
}

bool criu_capable(const std::string& criu_path, std::uint64_t own_ambient, std::uint64_t wanted) {
  if ((own_ambient & wanted) == wanted) return true;
  // struct vfs_cap_data: magic_etc, then {permitted, inheritable} for bits 0-31 and 32-63 (little endian).
  std::uint32_t raw[6] = {};
  const ssize_t n = ::getxattr(criu_path.c_str(), "security.capability", raw, sizeof raw);
  if (n < 20) return false;
  constexpr std::uint32_t effective_flag = 0x000001, revision_mask = 0xFF000000;
  const std::uint32_t revision = raw[0] & revision_mask;
  if ((revision != 0x02000000 && revision != 0x03000000) || (raw[0] & effective_flag) == 0) return false;
  const std::uint64_t permitted = raw[1] | (std::uint64_t{raw[3]} << 32);
  return (permitted & wanted) == wanted;
}

namespace {

// What CRIU needs, not run as root (criu --unprivileged): CAP_CHECKPOINT_RESTORE (40) and CAP_SYS_PTRACE (19).
constexpr std::uint64_t unprivileged_caps = (std::uint64_t{1} << 40) | (std::uint64_t{1} << 19);

// The capabilities this process passes on to a program it runs (CapAmb in /proc/self/status).
std::uint64_t own_ambient_caps() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("CapAmb:", 0) == 0) return std::strtoull(line.c_str() + 7, nullptr, 16);
  return 0;
}

void require_privileges(criu_tool& criu) {
  if (::geteuid() == 0) return;
  if (!criu_capable(criu.path, own_ambient_caps(), unprivileged_caps))
    throw criu_unavailable(
        "a whole-process checkpoint runs CRIU, which needs root, or CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE "
        "(`sudo setcap cap_checkpoint_restore,cap_sys_ptrace+ep " +
        criu.path + "`, on Linux 5.9 or later); this user (uid " + std::to_string(::geteuid()) +
        ") has neither, and nothing was touched. Without --process, dump, suspend and restore need no privilege");
  criu.unprivileged = true;
}

}  // namespace

criu_tool find_criu() {
  criu_tool criu;
  const char* chosen = std::getenv("VMMCKPT_CRIU");
  if (chosen != nullptr && *chosen != '\0') {
    if (::access(chosen, X_OK) != 0)
      throw criu_unavailable(std::string("VMMCKPT_CRIU=") + chosen + " is not an executable file; " + how_to_get);
    criu.path = chosen;
  } else {
    criu.path = find_on_path("criu");
    if (criu.path.empty()) throw criu_unavailable(std::string("criu is not on PATH; ") + how_to_get);
  }
  char scratch[] = "/tmp/cuda-ckpt-criu-version-XXXXXX";
  const int fd = ::mkstemp(scratch);
  if (fd < 0) throw tool_error(std::string("cannot make a scratch file in /tmp: ") + std::strerror(errno));
  ::close(fd);
  const int status = spawn_and_wait({criu.path, "--version"}, scratch);
  std::ifstream in(scratch);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(scratch);
  const auto at = text.find("Version: ");
  if (status != 0 || at == std::string::npos)
    throw criu_unavailable(criu.path + " --version failed (exit " + std::to_string(status) +
                           "): " + text.substr(0, 200) + "; " + how_to_get);
  criu.version = text.substr(at + 9, text.find('\n', at) - at - 9);
  if (std::atoi(criu.version.c_str()) < criu_min_major)
    throw criu_unavailable(criu.path + " is CRIU " + criu.version + ", too old; " + how_to_get);
  require_privileges(criu);
  return criu;
}

int run_criu(const criu_tool& criu, const std::vector<std::string>& args, const std::filesystem::path& log,
             const std::function<void(pid_t)>& started, const std::filesystem::path& status_file,
             const std::function<bool()>& abandon) {
  std::vector<std::string> argv;
  if (!status_file.empty())
    argv = {"/bin/sh", "-c", "f=$1; shift; \"$@\"; s=$?; echo $s >\"$f.tmp\" && mv -f \"$f.tmp\" \"$f\"; exit $s", "sh",
            std::filesystem::absolute(status_file).string()};
  argv.push_back(criu.path);
  argv.insert(argv.end(), args.begin(), args.end());
  if (criu.unprivileged) argv.emplace_back("--unprivileged");
  argv.insert(argv.end(), {"--log-file", std::filesystem::absolute(log).string(), "-v2"});
  return spawn_and_wait(argv, std::filesystem::absolute(log).string() + ".out", started, abandon);
}

namespace {
// Each line of CRIU's log, then of what it printed beside it.
void for_each_log_line(const std::filesystem::path& log, const std::function<void(const std::string&)>& visit) {
  for (const auto& file : {log, std::filesystem::path(log.string() + ".out")}) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) visit(line);
  }
}
}  // namespace

bool criu_log_mentions(const std::filesystem::path& log, const std::string& text) {
  bool found = false;
  for_each_log_line(log, [&](const std::string& line) { found = found || line.find(text) != std::string::npos; });
  return found;
}

std::string criu_log_excerpt(const std::filesystem::path& log) {
  std::vector<std::string> errors, last;
  for_each_log_line(log, [&](const std::string& line) {
    if (line.find("Error") != std::string::npos) errors.push_back(line);
    last.push_back(line);
    if (last.size() > 5) last.erase(last.begin());
  });
  const auto& chosen = errors.empty() ? last : errors;
  std::string out;
  for (std::size_t i = chosen.size() > 6 ? chosen.size() - 6 : 0; i < chosen.size(); ++i) out += "\n  " + chosen[i];
  return out;
}

}  // namespace vmmckpt::ckpt
