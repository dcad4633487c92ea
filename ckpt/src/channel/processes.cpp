// Finding the processes under the shim (their maps, their control addresses) and asking them all at once for `cuda-ckpt ps`.
#include "vmmckpt/ckpt/processes.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/image/staging_name.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::ckpt {
namespace {

namespace fs = std::filesystem;

std::string proc_dir(pid_t pid) { return "/proc/" + std::to_string(pid); }

// Numeric entries of /proc: every process we can see.
std::vector<pid_t> all_pids() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid > 0 && end != nullptr && *end == '\0') out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

// Pids of the control socket files in our runtime directory: processes whose maps we may not read
// (made non-dumpable) are still found through them.
std::vector<pid_t> pids_of_our_sockets() {
  std::vector<pid_t> out;
  std::vector<std::string> dirs = private_socket_dirs("/tmp", ::geteuid());
  dirs.insert(dirs.begin(), protocol::runtime_dir());
  std::error_code ec;
  for (const std::string& dir : dirs) {
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() < 6 || name.compare(name.size() - 5, 5, ".sock") != 0) continue;
      char* end = nullptr;
      const long pid = std::strtol(name.c_str(), &end, 10);
      if (pid > 0 && end == name.c_str() + name.size() - 5) out.push_back(static_cast<pid_t>(pid));
    }
  }
  return out;
}

// Pids whose abstract name is bound in our network namespace (/proc/net/unix lists them as
// "@vmmckpt/PID", or "@vmmckpt/PID.RANDOM" when someone else held that): processes whose maps we may not
// read are still found this way. Whoever holds a name is checked when connecting.
std::vector<pid_t> pids_of_abstract_names() {
  std::vector<pid_t> out;
  std::ifstream in("/proc/net/unix");
  std::string line;
  const std::string prefix = protocol::printable_address(protocol::abstract_address(0));  // "@vmmckpt/0"
  const std::string stem = prefix.substr(0, prefix.size() - 1);
  while (std::getline(in, line)) {
    const auto at = line.rfind(' ');
    if (at == std::string::npos || line.compare(at + 1, stem.size(), stem) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(line.c_str() + at + 1 + stem.size(), &end, 10);
    if (pid > 0 && end != nullptr && (*end == '\0' || *end == '.')) out.push_back(static_cast<pid_t>(pid));
  }
  return out;
}

uid_t owner_of(pid_t pid) {
  struct stat st {};
  return ::stat(proc_dir(pid).c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

process_entry ask(pid_t pid, deadline until) {
  process_entry e;
  e.pid = pid;
  e.uid = owner_of(pid);
  try {
    control_client client(pid, until);
    control::hello_reply hello = client.hello();
    e.status = status_of(hello);
    e.command = hello.command;
    e.hello = std::move(hello);
  } catch (const control_error& err) {
    // Took no connection or sent no answer in time (stopped, frozen, or swamped), or turned the
    // connection away as busy: it is there, just not answering.
    const bool silent =
        err.channel == protocol::failure_kind::timed_out || (err.refused && err.refusal == control::refusal::busy);
    e.status = silent ? "not responding" : "unreachable";
    e.problem = err.what();
  } catch (const no_control_server& err) {
    e.status = "no control server";
    e.problem = err.what();
  } catch (const tool_error& err) {
    e.status = "unreachable";
    e.problem = err.what();
  }
  if (!e.hello) e.command = command_line_of(pid);
  return e;
}

}  // namespace

bool process_exists(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

void require_own_process(pid_t pid) {
  const uid_t owner = owner_of(pid);
  if (::geteuid() == 0 || owner == ::geteuid() || owner == static_cast<uid_t>(-1)) return;
  throw tool_error("process " + std::to_string(pid) + " belongs to another user (uid " + std::to_string(owner) +
                   "); only its owner or root may checkpoint it");
}

bool process_alive(pid_t pid) { return pid > 0 && suspend_claim::start_time(pid) != 0; }  // 0: gone, or a zombie

bool staging_writer_alive(const fs::path& staging) {
  const pid_t pid = image::staging_writer(staging.filename().string());
  if (pid == 0 || !process_exists(pid)) return false;
  struct stat dir {
  }, proc{};
  if (::stat(staging.c_str(), &dir) != 0 || ::stat(("/proc/" + std::to_string(pid)).c_str(), &proc) != 0) return true;
  return proc.st_mtime <= dir.st_mtime + 1;  // /proc/PID's time is its process's start
}

bool maps_file(pid_t pid, std::string_view prefix) {
  std::ifstream in(proc_dir(pid) + "/maps");
  for (std::string line; std::getline(in, line);) {
    const auto slash = line.rfind('/');
    if (slash != std::string::npos && line.compare(slash + 1, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

namespace {

// The state letter and parent of /proc/PID/stat; false when it cannot be read.
bool stat_of(pid_t pid, char& state, long& parent) {
  std::ifstream in(proc_dir(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so read after the last ')'.
  const auto close = text.rfind(')');
  return close != std::string::npos && std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &parent) == 2;
}

}  // namespace

pid_t parent_of(pid_t pid) {
  char state = 0;
  long parent = 0;
  return stat_of(pid, state, parent) ? static_cast<pid_t>(parent) : 0;
}

bool process_stopped(pid_t pid) {
  char state = 0;
  long parent = 0;
  return stat_of(pid, state, parent) && state == 'T';
}

std::vector<pid_t> stopped_among(const std::vector<pid_t>& pids) {
  std::vector<pid_t> stopped;
  for (const pid_t pid : pids)
    if (process_stopped(pid)) stopped.push_back(pid);
  return stopped;
}

std::string stopped_refusal(pid_t pid, std::string_view again) {
  const std::string p = std::to_string(pid);
  return "process " + p +
         " is stopped by a signal (SIGSTOP, Ctrl-Z or a job scheduler's suspend): continue it (`kill -CONT " + p +
         "`) and " + std::string(again);
}

std::vector<pid_t> process_tree(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parents;  // (pid, parent) of every process
  for (const pid_t pid : all_pids()) parents.emplace_back(pid, parent_of(pid));
  std::vector<pid_t> tree{root};
  for (std::size_t i = 0; i < tree.size(); ++i)
    for (const auto& [pid, parent] : parents)
      if (parent == tree[i]) tree.push_back(pid);
  return tree;
}

std::string short_name_of(pid_t pid) {
  std::ifstream in(proc_dir(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

shim_presence shim_in(pid_t pid) {
  std::ifstream in(proc_dir(pid) + "/maps");
  if (!in) return shim_presence::unknown;
  std::string line;
  bool read_any = false;
  while (std::getline(in, line)) {
    read_any = true;
    // The file's path is the last field; a replaced file reads "NAME (deleted)".
    const auto slash = line.rfind('/');
    if (slash != std::string::npos && line.compare(slash + 1, shim_file_name.size(), shim_file_name) == 0)
      return shim_presence::loaded;
  }
  // Permission is checked when reading: another user's maps open but read nothing.
  return read_any ? shim_presence::absent : shim_presence::unknown;
}

pid_t pid_in_own_namespace(pid_t pid) {
  std::ifstream in(proc_dir(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    const auto last = line.find_last_of(" \t");
    const long inner = last == std::string::npos ? 0 : std::strtol(line.c_str() + last + 1, nullptr, 10);
    return inner > 0 ? static_cast<pid_t>(inner) : pid;
  }
  return pid;
}

bool sees_directory(pid_t pid, const std::filesystem::path& dir) {
  std::error_code ec;
  auto path = std::filesystem::absolute(dir, ec).lexically_normal();
  while (!ec && !std::filesystem::exists(path, ec) && path.has_relative_path()) path = path.parent_path();
  struct stat ours {};
  if (ec || ::stat(path.c_str(), &ours) != 0) return true;
  struct stat theirs {};
  if (::stat((proc_dir(pid) + "/root" + path.string()).c_str(), &theirs) != 0) return errno == EACCES || errno == EPERM;
  return ours.st_dev == theirs.st_dev && ours.st_ino == theirs.st_ino;
}

std::optional<std::string> environment_value(pid_t pid, std::string_view name) {
  std::ifstream in(proc_dir(pid) + "/environ", std::ios::binary);
  std::string entry;
  std::optional<std::string> value;
  while (std::getline(in, entry, '\0'))
    if (entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 && entry[name.size()] == '=')
      value = entry.substr(name.size() + 1);
  return value;
}

std::vector<std::string> private_socket_dirs(const std::string& tmp, uid_t uid) {
  std::vector<std::string> out;
  const std::string prefix = fs::path(protocol::private_dir_prefix(uid)).filename().string();  // "vmmckpt-UID."
  DIR* d = ::opendir(tmp.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (std::string_view(e->d_name).substr(0, prefix.size()) != prefix) continue;
    std::string dir = tmp + "/" + e->d_name;
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 077) == 0)
      out.push_back(std::move(dir));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// The socket `file` in each of uid's private socket directories under `tmp` that holds one.
std::vector<std::string> private_socket_files(const std::string& tmp, uid_t uid, const std::string& file) {
  std::vector<std::string> out;
  for (const std::string& dir : private_socket_dirs(tmp, uid)) {
    struct stat st {};
    if (::lstat((dir + "/" + file).c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) out.push_back(dir + "/" + file);
  }
  return out;
}

void push_unique(std::vector<std::string>& out, std::string address) {
  if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(std::move(address));
}

// A process in a pid namespace of its own (a container), where it is `inner`, names its socket by the pid it
// sees, in the directories of its own mount namespace: reached through /proc/PID/root (its abstract name is in
// its own network namespace). The peer check still names the process by this pid: the kernel translates it.
std::vector<std::string> addresses_in_own_namespace(pid_t pid, pid_t inner) {
  const std::string root = proc_dir(pid) + "/root";
  const std::string file = std::to_string(inner) + ".sock";
  std::vector<std::string> out;
  if (const auto xdg = environment_value(pid, "XDG_RUNTIME_DIR"); xdg && !xdg->empty())
    out.push_back(root + *xdg + "/vmmckpt/" + file);
  const uid_t uid = owner_of(pid);
  if (uid != static_cast<uid_t>(-1) && uid != 0)
    out.push_back(root + "/tmp/vmmckpt-" + std::to_string(uid) + "/" + file);
  out.push_back(root + "/tmp/vmmckpt-0/" + file);  // root, or root of a user namespace of its own
  for (const uid_t owner : {uid, static_cast<uid_t>(0)})
    if (owner != static_cast<uid_t>(-1))
      for (auto& f : private_socket_files(root + "/tmp", owner, file)) push_unique(out, std::move(f));
  return out;
}

// The socket files first: their directories are the owner's alone (one someone else made is refused by the
// program, which then listens in a private directory of its own, looked in next). The abstract names come
// last, since anyone may bind one first and then never answer.
std::vector<std::string> addresses_here(pid_t pid) {
  std::vector<std::string> out;
  const std::string file = std::to_string(pid) + ".sock";
  const uid_t uid = owner_of(pid);
  const auto xdg = environment_value(pid, "XDG_RUNTIME_DIR");
  if (xdg && !xdg->empty()) {
    std::string dir = *xdg;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    out.push_back((dir == "/" ? dir : dir + "/") + "vmmckpt/" + file);
  } else if (uid != static_cast<uid_t>(-1)) {
    out.push_back("/tmp/vmmckpt-" + std::to_string(uid) + "/" + file);
  }
  if (uid == ::geteuid()) out.push_back(protocol::socket_path(pid));
  if (uid != static_cast<uid_t>(-1))
    for (auto& f : private_socket_files("/tmp", uid, file)) out.push_back(std::move(f));
  for (auto& name : protocol::abstract_addresses(pid)) out.push_back(std::move(name));
  std::vector<std::string> unique;
  for (auto& a : out) push_unique(unique, std::move(a));
  return unique;
}

}  // namespace

std::vector<std::string> control_addresses(pid_t pid) {
  if (const pid_t inner = pid_in_own_namespace(pid); inner != pid && inner > 0)
    return addresses_in_own_namespace(pid, inner);
  return addresses_here(pid);
}

std::vector<std::string> command_line_of(pid_t pid) {
  std::ifstream in(proc_dir(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(in, arg, '\0')) out.push_back(arg);
  return out;
}

std::string status_of(const control::hello_reply& hello) {
  if (hello.activity != control::activity::idle) return std::string(control::name_of(hello.activity));
  return std::string(control::name_of(hello.state));
}

bool waits_for_resume(const control::hello_reply& hello) {
  return hello.state == control::process_state::suspended && hello.activity != control::activity::resuming;
}

std::vector<process_entry> list_processes(pid_t only, std::chrono::milliseconds wait) {
  std::set<pid_t> candidates;
  if (only != 0) {
    candidates.insert(only);
  } else {
    for (pid_t pid : all_pids())
      if (shim_in(pid) == shim_presence::loaded) candidates.insert(pid);
    // Another user's names are visible too; only root may ask those processes.
    for (pid_t pid : pids_of_abstract_names())
      if (process_exists(pid) && (::geteuid() == 0 || owner_of(pid) == ::geteuid())) candidates.insert(pid);
    for (pid_t pid : pids_of_our_sockets())
      if (process_exists(pid)) candidates.insert(pid);
  }
  // All at once, so that the list takes `wait` however many do not answer.
  const deadline until = deadline::in(wait);
  std::vector<std::future<process_entry>> asked;
  asked.reserve(candidates.size());
  for (pid_t pid : candidates) asked.push_back(std::async(std::launch::async, ask, pid, until));
  std::vector<process_entry> out;
  for (auto& f : asked) {
    process_entry e = f.get();
    if (!e.hello) {
      const shim_presence presence = shim_in(e.pid);
      if (only != 0 && presence != shim_presence::loaded) throw tool_error(e.problem);
      // Gone meanwhile, or a socket file left by an earlier process of that pid, or a name someone
      // else holds: not one of ours.
      if (!process_exists(e.pid) || presence == shim_presence::absent) continue;
    }
    out.push_back(std::move(e));
  }
  return out;  // std::set kept them ascending
}

std::string where_processes_are_looked_for() {
  return std::string("/proc/*/maps for ") + std::string(shim_file_name) + " (" +
         (::geteuid() == 0 ? "every user's processes" : "this user's processes") +
         "), at the control sockets @vmmckpt/PID in /proc/net/unix and at the socket files in " +
         protocol::runtime_dir() + " and " + protocol::private_dir_prefix(::geteuid()) + "*";
}

}  // namespace vmmckpt::ckpt
