// `cuda-ckpt gc`: what crashed or killed tools leave behind, removed only when no process depends on it.
#include "vmmckpt/ckpt/leftovers.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/protocol.hpp"
#include "vmmckpt/suspend_claim.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool process_exists(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// The writer of NAME.partial-PID-RANDOM, by the pid in its name; a process of that pid that started
// after the directory was made is another one (the pid was reused).
bool writer_alive(const fs::path& partial) {
  const std::string name = partial.filename().string();
  const auto at = name.rfind(".partial-");
  if (at == std::string::npos) return false;
  const pid_t pid = static_cast<pid_t>(std::strtol(name.c_str() + at + 9, nullptr, 10));
  if (!process_exists(pid)) return false;
  struct stat dir{}, proc{};
  if (::stat(partial.c_str(), &dir) != 0 || ::stat(("/proc/" + std::to_string(pid)).c_str(), &proc) != 0) return true;
  return proc.st_mtime <= dir.st_mtime + 1;  // /proc/PID's time is its process's start
}

// Whether a suspend image's program still depends on it, and why (or why not).
bool still_needed(const fs::path& image, const suspend_claim::parties& p, std::string& why) {
  if (!suspend_claim::alive(p.target_pid, p.target_start)) {
    why = "its program (" + std::to_string(p.target_pid) + ") is gone";
    return false;
  }
  try {
    control_client client(p.target_pid, control_client::clock::now() + std::chrono::seconds(2));
    const auto hello = client.hello();
    if (hello.state == control::process_state::suspended && fs::equivalent(hello.image, image)) {
      why = "process " + std::to_string(p.target_pid) + " is suspended on it";
      return true;
    }
    why = "process " + std::to_string(p.target_pid) +
          (hello.state == control::process_state::suspended ? " is suspended on another image" : " has been resumed");
    return false;
  } catch (const std::exception& e) {
    // Stopped, busy or unreachable: it may depend on the image, so it stays.
    why = "process " + std::to_string(p.target_pid) + " did not say whether it needs it (" + e.what() + ")";
    return true;
  }
}

void remove(const fs::path& path, const std::string& why, bool dry_run, leftovers_report& report) {
  std::error_code ec;
  if (!dry_run) fs::remove_all(path, ec);
  if (ec)
    report.kept.push_back({path, "cannot remove it: " + ec.message()});
  else
    report.removed.push_back({path, why});
}

void collect_in(const fs::path& dir, bool dry_run, leftovers_report& report) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path path = entry.path();
    if (!entry.is_directory(ec) || entry.is_symlink(ec)) continue;
    const std::string name = path.filename().string();
    if (name.find(".partial-") != std::string::npos) {
      if (!writer_alive(path)) remove(path, "an unfinished image whose writer is gone", dry_run, report);
      continue;
    }
    // Suspend images carry a claim file (suspend_claim.hpp); other images are nobody's business here.
    if (fs::exists(path / suspend_claim::cancelled)) {
      remove(path, "a suspend image withdrawn by its tool", dry_run, report);
      continue;
    }
    suspend_claim::parties parties;
    if (fs::exists(path / suspend_claim::pending)) {
      if (!suspend_claim::decode(read_file(path / suspend_claim::pending), parties)) {
        report.kept.push_back({path, "its claim file cannot be read"});
        continue;
      }
      if (suspend_claim::alive(parties.tool_pid, parties.tool_start)) {
        report.kept.push_back({path, "its suspend is under way (tool " + std::to_string(parties.tool_pid) + ")"});
        continue;
      }
      // The tool died: withdraw the request, so that its program can never take it after this.
      if (dry_run || suspend_claim::take(path.string(), suspend_claim::cancelled)) {
        remove(path, "a suspend image whose tool died before its program took it", dry_run, report);
        continue;
      }
      // The program took it meanwhile: an accepted image, below.
    }
    if (fs::exists(path / suspend_claim::accepted)) {
      if (!suspend_claim::decode(read_file(path / suspend_claim::accepted), parties)) {
        report.kept.push_back({path, "its claim file cannot be read"});
        continue;
      }
      std::string why;
      if (still_needed(path, parties, why))
        report.kept.push_back({path, why});
      else
        remove(path, "a suspend image nobody needs: " + why, dry_run, report);
    }
  }
}

}  // namespace

fs::path default_suspend_dir() {
  const fs::path dir = "/dev/shm/vmmckpt-" + std::to_string(::geteuid());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw tool_error("cannot create " + dir.string() + ": " + std::strerror(errno));
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    throw tool_error(dir.string() + " is not a private directory of ours; use -o DIR");
  return dir;
}

leftovers_report collect_leftovers(const std::vector<fs::path>& dirs, bool dry_run) {
  leftovers_report report;
  if (dirs.empty())
    collect_in(default_suspend_dir(), dry_run, report);
  else
    for (const auto& d : dirs) collect_in(d, dry_run, report);
  // Sockets of processes that are gone; never anything but a socket.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(protocol::runtime_dir(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 6 || name.substr(name.size() - 5) != ".sock" || !entry.is_socket(ec)) continue;
    const pid_t pid = static_cast<pid_t>(std::strtol(name.c_str(), nullptr, 10));
    if (pid > 0 && !process_exists(pid)) remove(entry.path(), "the socket of a process that is gone", dry_run, report);
  }
  return report;
}

}  // namespace vmmckpt::ckpt
