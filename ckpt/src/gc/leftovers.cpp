// `cuda-ckpt gc`: what crashed or killed tools leave behind, removed only when no process depends on it.
#include "vmmckpt/ckpt/leftovers.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <algorithm>
#include <iterator>
#include <sys/socket.h>
#include <system_error>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/protocol/protocol.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Whether a suspend image's program still depends on it, and why (or why not).
bool still_needed(const fs::path& image, const suspend_claim::parties& p, std::string& why) {
  if (!suspend_claim::alive(p.target_pid, p.target_start)) {
    why = "its program (" + std::to_string(p.target_pid) + ") is gone";
    return false;
  }
  try {
    control_client client(p.target_pid, deadline::in(std::chrono::seconds(2)));
    const auto hello = client.hello();
    if (hello.state == control::process_state::suspended && fs::equivalent(hello.image, image)) {
      why = "process " + std::to_string(p.target_pid) + " is suspended on it";
      return true;
    }
    // Between taking the claim and saying it is suspended, a program is still suspending (it frees its memory):
    // the image is its own by then.
    if (hello.activity == control::activity::suspending || hello.activity == control::activity::resuming) {
      why = "process " + std::to_string(p.target_pid) + " is " + std::string(control::name_of(hello.activity));
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

// The whole-process image whose gpu/ directory `dir` is (finished, or being written or left unfinished: its
// process.json, its intent record, its criu/ or its .partial- name tells), or empty.
fs::path process_image_of_parts(const fs::path& dir) {
  fs::path d = fs::absolute(dir).lexically_normal();
  if (!d.has_filename()) d = d.parent_path();
  if (d.filename() != gpu_dir_name) return {};
  const fs::path image = d.parent_path();
  struct stat st {};
  const bool marked = is_process_image(image) || ::lstat((image / process_intent_name).c_str(), &st) == 0 ||
                      ::lstat((image / criu_dir_name).c_str(), &st) == 0 ||
                      image::is_staging_name(image.filename().string());
  return marked ? image : fs::path();
}

// An unfinished whole-process image (dump --process, its tool killed midway) holds each process's GPU
// part in gpu/PID: a process suspended on one still needs it, until `cuda-ckpt resume PID`. Why it stays,
// or "" when no process needs any part.
std::string gpu_part_needed(const fs::path& partial) {
  std::error_code ec;
  for (const auto& part : fs::directory_iterator(partial / gpu_dir_name, ec)) {
    suspend_claim::parties p;
    if (!suspend_claim::decode(read_file(part.path() / suspend_claim::accepted), p)) continue;
    std::string why;
    if (still_needed(part.path(), p, why))
      return "an unfinished whole-process image: " + why + " (`cuda-ckpt resume " + std::to_string(p.target_pid) +
             "` brings it back; gc removes the rest afterwards)";
  }
  return {};
}

void remove(const fs::path& path, const std::string& why, bool dry_run, leftovers_report& report) {
  std::error_code ec;
  if (!dry_run) fs::remove_all(path, ec);
  if (ec)
    report.kept.push_back({path, "cannot remove it: " + ec.message()});
  else
    report.removed.push_back({path, why});
}

// What an entry of a suspend directory is, judged from its files and which processes live, without
// touching it or asking any process: gc acts on it, ps lists the orphans.
struct judgement {
  enum kind {
    not_an_image,      // a file, a symlink, or an image that is no suspend image
    partial_live,      // an unfinished image whose writer is still at it
    partial_orphan,    // an unfinished image whose writer is gone
    partial_complete,  // an unfinished whole-process image that can be completed (CRIU's part is done)
    withdrawn,         // a suspend image its tool withdrew
    pending_live,      // a suspend under way (its tool lives)
    pending_orphan,    // a suspend image whose tool died before its program took it
    accepted_orphan,   // a suspend image whose program is gone
    accepted_live,     // a suspend image whose program lives: it may need it (ask it)
    unreadable,        // its claim file cannot be read
  } what = not_an_image;
  suspend_claim::parties parties;
  pid_t pid = 0;  // whose it was: the writer of a partial image, else the program of a suspend image
};

judgement judge(const fs::directory_entry& entry) {
  judgement j;
  std::error_code ec;
  const fs::path& path = entry.path();
  if (!entry.is_directory(ec) || entry.is_symlink(ec)) return j;
  const std::string name = path.filename().string();
  if (image::is_staging_name(name)) {
    j.pid = image::staging_writer(name);
    std::string why_not;
    j.what = staging_writer_alive(path)  ? judgement::partial_live
             : finishable(path, why_not) ? judgement::partial_complete
                                         : judgement::partial_orphan;
    return j;
  }
  // Suspend images carry a claim file (suspend_claim.hpp); other images are nobody's business here.
  if (fs::exists(path / suspend_claim::cancelled)) {
    j.what = judgement::withdrawn;
    // The withdrawn claim still names the program (for ps); no matter when it does not.
    if (suspend_claim::decode(read_file(path / suspend_claim::cancelled), j.parties)) j.pid = j.parties.target_pid;
    return j;
  }
  const bool pending = fs::exists(path / suspend_claim::pending);
  if (!pending && !fs::exists(path / suspend_claim::accepted)) return j;
  if (!suspend_claim::decode(read_file(path / (pending ? suspend_claim::pending : suspend_claim::accepted)),
                             j.parties)) {
    j.what = judgement::unreadable;
    return j;
  }
  j.pid = j.parties.target_pid;
  if (pending)
    j.what = suspend_claim::alive(j.parties.tool_pid, j.parties.tool_start) ? judgement::pending_live
                                                                            : judgement::pending_orphan;
  else
    j.what = suspend_claim::alive(j.parties.target_pid, j.parties.target_start) ? judgement::accepted_live
                                                                                : judgement::accepted_orphan;
  return j;
}

// An image the process it belonged to can no longer use, and why; empty for anything else.
std::string orphan_reason(const judgement& j) {
  switch (j.what) {
    case judgement::partial_orphan: return "an unfinished image whose writer is gone";
    case judgement::withdrawn: return "a suspend image withdrawn by its tool";
    case judgement::pending_orphan: return "a suspend image whose tool died before its program took it";
    case judgement::accepted_orphan:
      return "a suspend image whose program (" + std::to_string(j.parties.target_pid) + ") is gone";
    default: return {};
  }
}

void collect_in(const fs::path& dir, bool dry_run, leftovers_report& report, bool accepted_job = false);
void collect_entry(const fs::directory_entry& entry, bool dry_run, leftovers_report& report, bool accepted_job);

// A job's suspend image (docs/job-checkpoint.md): settled by its claim. Cancelled, or pending with its tool gone
// (cancelled here first, so that no rank can suspend on it after), nobody depends on it; accepted, each rank's
// image is judged as a suspend image, and the job's directory goes once none is left.
void collect_job(const fs::path& dir, bool dry_run, leftovers_report& report) {
  std::error_code ec;
  if (fs::exists(dir / suspend_claim::job_pending, ec)) {
    suspend_claim::parties p;
    if (suspend_claim::decode(read_file(dir / suspend_claim::job_pending), p) &&
        suspend_claim::alive(p.tool_pid, p.tool_start)) {
      report.kept.push_back({dir, "a job's suspend is under way (tool " + std::to_string(p.tool_pid) + ")"});
      return;
    }
    if (dry_run || suspend_claim::take_job(dir.string(), suspend_claim::job_cancelled)) {
      remove(dir, "a job's suspend whose tool died before every rank's image was complete", dry_run, report);
      return;
    }
  }
  if (fs::exists(dir / suspend_claim::job_cancelled, ec)) {
    remove(dir, "a job's suspend that was cancelled (its ranks went on)", dry_run, report);
    return;
  }
  const std::size_t skipped = report.skipped.size();
  collect_in(dir, dry_run, report, /*accepted_job=*/true);
  if (report.skipped.size() != skipped) return;  // what could not be read may be a rank's image
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory(ec)) return;  // a rank's image some process may need
  remove(dir, "a job's suspend image whose ranks are all resumed or gone", dry_run, report);
}

// A directory of a job's suspend: it holds the job's claim, in any state.
bool is_job_directory(const fs::directory_entry& entry) {
  std::error_code ec;
  const fs::path& path = entry.path();
  return entry.is_directory(ec) && !entry.is_symlink(ec) &&
         (fs::exists(path / suspend_claim::job_pending, ec) || fs::exists(path / suspend_claim::job_accepted, ec) ||
          fs::exists(path / suspend_claim::job_cancelled, ec));
}

// A complete snapshot whose dump's tool died after CRIU succeeded: its processes may still be stopped or
// suspended on it (then it stays as it is), else it is completed, never removed: once they are gone it is their
// only copy.
void collect_complete_snapshot(const fs::path& path, bool dry_run, leftovers_report& report) {
  if (const std::string why = gpu_part_needed(path); !why.empty()) {
    report.kept.push_back({path, why});
    return;
  }
  if (dry_run) {
    report.kept.push_back({path, "an unfinished whole-process image whose CRIU dump succeeded: gc completes it"});
    return;
  }
  try {
    const fs::path done = finish_process_dump(path);
    report.kept.push_back({done, "completed from " + path.filename().string() +
                                     " (its dump's tool died after CRIU succeeded): `cuda-ckpt restore " +
                                     done.string() + "` brings its processes back"});
  } catch (const std::exception& e) {
    report.kept.push_back({path, std::string("an unfinished whole-process image that cannot be completed now (") +
                                     e.what() + "): `cuda-ckpt restore " + path.string() + "` does it"});
  }
}

void collect_accepted(const fs::path& path, const judgement& j, bool dry_run, leftovers_report& report) {
  std::string why;
  if (still_needed(path, j.parties, why))
    report.kept.push_back({path, why});
  else
    remove(path, "a suspend image nobody needs: " + why, dry_run, report);
}

// A suspend image whose tool died before its program took the claim.
void collect_pending_orphan(const fs::directory_entry& entry, judgement j, bool dry_run, leftovers_report& report,
                            bool accepted_job) {
  const fs::path& path = entry.path();
  if (accepted_job) {
    if (suspend_claim::alive(j.parties.target_pid, j.parties.target_start))
      report.kept.push_back({path, "a rank of a job whose suspend is accepted: process " +
                                       std::to_string(j.parties.target_pid) + " suspends itself on it"});
    else
      remove(path, "a rank's image of a suspended job whose process is gone", dry_run, report);
    return;
  }
  // The tool died: withdraw the request, so that its program can never take it after this.
  if (dry_run || suspend_claim::take(path.string(), suspend_claim::cancelled)) {
    remove(path, orphan_reason(j), dry_run, report);
    return;
  }
  // The program took it meanwhile: an accepted image.
  j = judge(entry);
  if (j.what != judgement::accepted_live && j.what != judgement::accepted_orphan) {
    report.kept.push_back({path, "its claim changed while it was looked at"});
    return;
  }
  collect_accepted(path, j, dry_run, report);
}

// One entry of a suspend directory: acted on, or said why it stays (collect_in's rules).
void collect_entry(const fs::directory_entry& entry, bool dry_run, leftovers_report& report, bool accepted_job) {
  const fs::path& path = entry.path();
  if (is_job_directory(entry)) {
    collect_job(path, dry_run, report);
    return;
  }
  const judgement j = judge(entry);
  switch (j.what) {
    case judgement::not_an_image:
    case judgement::partial_live: break;
    case judgement::partial_complete: collect_complete_snapshot(path, dry_run, report); break;
    case judgement::unreadable: report.kept.push_back({path, "its claim file cannot be read"}); break;
    case judgement::pending_live:
      report.kept.push_back({path, "its suspend is under way (tool " + std::to_string(j.parties.tool_pid) + ")"});
      break;
    case judgement::pending_orphan: collect_pending_orphan(entry, j, dry_run, report, accepted_job); break;
    case judgement::accepted_live:
    case judgement::accepted_orphan: collect_accepted(path, j, dry_run, report); break;
    case judgement::partial_orphan:
      if (const std::string why = gpu_part_needed(path); !why.empty()) {
        report.kept.push_back({path, why});
        break;
      }
      remove(path, orphan_reason(j), dry_run, report);
      break;
    case judgement::withdrawn: remove(path, orphan_reason(j), dry_run, report); break;
  }
}

// `accepted_job`: the ranks' images of a job whose suspend is accepted. A rank that has not taken its own claim yet
// (stopped before it read its request, or its tool gone) suspends itself on it: its claim is never withdrawn here.
void collect_in(const fs::path& dir, bool dry_run, leftovers_report& report, bool accepted_job) {
  std::error_code ec;
  // The GPU parts of a whole-process image are suspend images whose programs are gone (ended by the dump, or
  // restored as other processes): they belong to the image, and go only with it.
  if (const fs::path whole = process_image_of_parts(dir); !whole.empty()) {
    for (const auto& entry : fs::directory_iterator(dir, ec))
      report.kept.push_back({entry.path(), "the GPU part of the whole-process image " + whole.string() +
                                               ": it goes only with the image (`cuda-ckpt rm " + whole.string() +
                                               "`)"});
    return;
  }
  fs::directory_iterator it(dir, ec);
  // Another user's directory: named and skipped (ENOENT: nothing there, nothing to say).
  if (ec && ec != std::errc::no_such_file_or_directory)
    report.skipped.push_back({dir, "cannot read it: " + ec.message()});
  for (const auto& entry : it) {
    // One entry this user cannot read (another user's image in a shared tree) must not stop the rest.
    try {
      collect_entry(entry, dry_run, report, accepted_job);
    } catch (const std::system_error& e) {
      report.skipped.push_back({entry.path(), "cannot read it: " + e.code().message()});
    }
  }
}

// Bytes the directory takes (allocated, as du counts them: what /dev/shm gives back when it goes).
std::uint64_t bytes_in(const fs::path& dir) {
  std::uint64_t bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

// Whether the socket file at `path` is one nobody listens at any more: its connection is refused.
// Never anything but a socket, and never one a process answers (or may answer: busy, stopped).
bool stale_socket(const fs::path& path, ino_t& inode) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  inode = st.st_ino;
  protocol::failure error;
  const int fd = protocol::connect_to(path.string(), 200, error);
  if (fd >= 0) {
    ::close(fd);
    return false;
  }
  return error.kind == protocol::failure_kind::connection_refused;
}

}  // namespace

std::vector<fs::path> suspend_dirs_of_all_users() {
  std::vector<fs::path> out;
  if (::geteuid() != 0) {
    const fs::path mine = suspend_dir_of(::geteuid());
    std::error_code ec;
    if (fs::is_directory(fs::symlink_status(mine, ec))) out.push_back(mine);
    return out;
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("vmmckpt-", 0) != 0 || name.find_first_not_of("0123456789", 8) != std::string::npos ||
        name.size() == 8)
      continue;
    struct stat st {};
    // Only a user's own directory: the uid in its name owns it.
    if (::lstat(entry.path().c_str(), &st) == 0 && S_ISDIR(st.st_mode) && std::to_string(st.st_uid) == name.substr(8))
      out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<orphaned_image> find_orphaned_images(const std::vector<fs::path>& dirs) {
  std::vector<orphaned_image> out;
  for (const auto& dir : dirs) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const judgement j = judge(entry);
      std::string why = orphan_reason(j);
      if (why.empty()) continue;
      out.push_back({entry.path(), j.pid, bytes_in(entry.path()), std::move(why)});
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return out;
}

std::string gc_command_for(const fs::path& dir) {
  const fs::path mine = suspend_dir_of(::geteuid());
  return dir == mine ? "cuda-ckpt gc" : "cuda-ckpt gc " + dir.string();
}

namespace {

// Removes the stale sockets in dir; whether it removed any.
bool remove_stale_sockets_in(const fs::path& dir, bool dry_run, leftovers_report& report) {
  bool removed = false;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 6 || name.compare(name.size() - 5, 5, ".sock") != 0) continue;
    // A live process under the shim made its socket (it replaces an older one at its first CUDA call):
    // it is not even asked, so that a stopped one costs nothing here.
    const pid_t pid = static_cast<pid_t>(std::strtol(name.c_str(), nullptr, 10));
    if (process_exists(pid) && shim_in(pid) == shim_presence::loaded) continue;
    ino_t inode = 0;
    if (!stale_socket(entry.path(), inode)) continue;
    // A new process of that pid replaces the file with its own socket: leave that one be.
    struct stat now {};
    if (::lstat(entry.path().c_str(), &now) == 0 && S_ISSOCK(now.st_mode) && now.st_ino == inode) {
      remove(entry.path(), "the socket of a process that is gone", dry_run, report);
      removed = true;
    }
  }
  return removed;
}

}  // namespace

void remove_stale_sockets(bool dry_run, leftovers_report& report) {
  remove_stale_sockets_in(protocol::runtime_dir(), dry_run, report);
  // A private directory (made where /tmp/vmmckpt-UID was someone else's) goes with the socket of a process
  // that is gone; one still empty may be a program's that is about to listen there.
  for (const std::string& dir : private_socket_dirs("/tmp", ::geteuid()))
    if (remove_stale_sockets_in(dir, dry_run, report) && !dry_run) ::rmdir(dir.c_str());
}

leftovers_report collect_leftovers(const std::vector<fs::path>& dirs, bool dry_run) {
  leftovers_report report;
  if (dirs.empty())
    collect_in(default_suspend_dir(), dry_run, report);
  else
    for (const auto& d : dirs) collect_in(d, dry_run, report);
  remove_stale_sockets(dry_run, report);
  for (auto& [path, why] : settle_transactions(dry_run)) report.removed.push_back({path, why});
  return report;
}

}  // namespace vmmckpt::ckpt
