// What a whole-process dump or restore leaves when its tool dies midway, and the one way back from it.
#include "vmmckpt/ckpt/process_recovery.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/image_owner.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/json_fields.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace jf = json_fields;
namespace {

constexpr const char* record_prefix = "whole-process-";
constexpr std::uint64_t max_record_bytes = 1u << 20;

const char* op_name(process_transaction::kind op) { return op == process_transaction::kind::dump ? "dump" : "restore"; }

std::string encode(const process_transaction& t) {
  nlohmann::ordered_json j;
  j["op"] = op_name(t.op);
  j["tool_pid"] = t.tool_pid;
  j["tool_start"] = t.tool_start;
  j["root_pid"] = t.root_pid;
  j["processes"] = nlohmann::json::array();
  for (const auto& [pid, start] : t.processes) j["processes"].push_back({pid, start});
  j["gpu_pids"] = t.gpu_pids;
  j["image"] = t.image.string();
  j["staging"] = t.staging.string();
  j["leave_running"] = t.leave_running;
  j["criu_pid"] = t.criu_pid;
  j["criu_start"] = t.criu_start;
  return j.dump(2) + "\n";
}

process_transaction decode(const std::string& text) {
  const jf::json j = jf::parse_limited(text, 4);
  process_transaction t;
  const std::string op = jf::string_of(j, "", "op");
  if (op != "dump" && op != "restore") throw jf::decode_error("op: unknown");
  t.op = op == "dump" ? process_transaction::kind::dump : process_transaction::kind::restore;
  t.tool_pid = jf::int_of(j, "", "tool_pid");
  t.tool_start = jf::u64_of(j, "", "tool_start");
  t.root_pid = jf::int_of(j, "", "root_pid");
  const auto& processes = jf::array_of(j, "", "processes");
  for (std::size_t i = 0; i < processes.size(); ++i) {
    const auto& pair = jf::array_at(processes[i], jf::index("processes", i));
    if (pair.size() != 2) throw jf::decode_error("processes: pairs expected");
    t.processes.emplace_back(jf::int_at(pair[0], "pid"), jf::u64_at(pair[1], "start"));
  }
  const auto& gpu = jf::array_of(j, "", "gpu_pids");
  for (std::size_t i = 0; i < gpu.size(); ++i) t.gpu_pids.push_back(jf::int_at(gpu[i], "gpu_pids"));
  t.image = jf::string_of(j, "", "image");
  t.staging = jf::string_of(j, "", "staging");
  t.leave_running = jf::bool_of(j, "", "leave_running");
  t.criu_pid = jf::int_of(j, "", "criu_pid");
  t.criu_start = jf::u64_of(j, "", "criu_start");
  return t;
}

// A small regular file's text, not through a link; "" when it is not one.
std::string read_plain(const fs::path& path, std::uint64_t limit, std::uint64_t tail = 0) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t from = tail > 0 && size > tail ? size - tail : 0;
    if (size - from <= limit) {
      text.resize(static_cast<std::size_t>(size - from));
      const ssize_t n = ::pread(fd, text.data(), text.size(), static_cast<off_t>(from));
      text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    }
  }
  ::close(fd);
  return text;
}

bool tool_alive(const process_transaction& t) { return suspend_claim::alive(t.tool_pid, t.tool_start); }
bool criu_alive(const process_transaction& t) {
  return t.criu_pid > 0 && suspend_claim::alive(t.criu_pid, t.criu_start);
}

// Writes the record under a temporary name, then renames it into place; false (errno set) when it cannot.
bool save(const process_transaction& t) {
  const fs::path temp = t.record.string() + "." + random_hex16() + ".tmp";
  const std::string text = encode(t);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int e = errno;
  if (fd >= 0) ::close(fd);
  ok = ok && ::rename(temp.c_str(), t.record.c_str()) == 0;
  if (!ok) {
    ::unlink(temp.c_str());
    errno = e != 0 ? e : ENOSPC;
  }
  return ok;
}

std::string pids_text(const std::vector<pid_t>& pids) {
  std::string out;
  for (pid_t p : pids) out += (out.empty() ? "" : " ") + std::to_string(p);
  return out;
}

// The final name of an unfinished image NAME.partial-PID-RANDOM.
fs::path final_name_of(const fs::path& partial) {
  const std::string name = image::final_name_of_staging(partial.filename().string());
  return name.empty() ? fs::path() : partial.parent_path() / name;
}

// A process took a suspend into this unfinished image's GPU parts (its claim is accepted).
bool suspended_some(const fs::path& staging) {
  std::error_code ec;
  for (const auto& part : fs::directory_iterator(staging / gpu_dir_name, ec)) {
    struct stat st {};
    if (::lstat((part.path() / suspend_claim::accepted).c_str(), &st) == 0) return true;
  }
  return false;
}

// The transaction's processes under the shim that are alive and stopped or suspended: each needs a resume.
std::vector<pid_t> waiting_for_gpu(const process_transaction& t, const std::vector<pid_t>& alive,
                                   const std::function<bool(pid_t)>& suspended) {
  std::vector<pid_t> waiting;
  for (pid_t p : t.gpu_pids)
    if (std::find(alive.begin(), alive.end(), p) != alive.end() && (process_stopped(p) || suspended(p)))
      waiting.push_back(p);
  return waiting;
}

// "cuda-ckpt resume 12; cuda-ckpt resume 34": the way back for each.
std::string resume_commands(const std::vector<pid_t>& waiting) {
  std::string command;
  for (pid_t p : waiting)
    command += (command.empty() ? "" : "; ") + std::string("cuda-ckpt resume ") + std::to_string(p);
  return command;
}

// Nothing to do: the processes run on (or ended for reasons of their own), as `words` says.
transaction_outcome runs_on(std::string words) {
  transaction_outcome o;
  o.what = transaction_outcome::kind::runs_on;
  o.words = std::move(words);
  return o;
}

// Each of `waiting` needs a resume for its GPU memory; `why` follows their pids in the sentence.
transaction_outcome resume_each(const std::vector<pid_t>& waiting, const std::string& why) {
  transaction_outcome o;
  o.what = transaction_outcome::kind::resume;
  o.words = "process " + pids_text(waiting) + why;
  o.command = resume_commands(waiting);
  return o;
}

transaction_outcome assess_dump(const process_transaction& t, const std::vector<pid_t>& alive,
                                const std::function<bool(pid_t)>& suspended) {
  using kind = transaction_outcome::kind;
  transaction_outcome o;
  const std::string image = jf::printable(t.image.string());
  // Its root's pid taken by a process that started after the dump did: the program was brought back since
  // (restored from this image or another), or the pid went to another program. Nothing is left to do here.
  if (alive.empty()) {
    const std::uint64_t now = suspend_claim::start_time(t.root_pid);
    if (now != 0 && now > t.tool_start)
      return runs_on("process " + std::to_string(t.root_pid) + " runs again (brought back since)");
  }
  if (!alive.empty()) {
    // CRIU stops the whole tree: one resume continues it all. Each process under the shim that is stopped or
    // suspended needs its own resume for its GPU memory.
    std::vector<pid_t> waiting = waiting_for_gpu(t, alive, suspended);
    bool stopped = false;
    for (pid_t p : alive) stopped = stopped || process_stopped(p);
    if (waiting.empty() && stopped) waiting.push_back(t.gpu_pids.empty() ? t.root_pid : t.gpu_pids.front());
    if (waiting.empty()) return runs_on("its processes run on");
    return resume_each(waiting, " is stopped or suspended by the dump" +
                                    (is_process_image(t.image) ? " (its image " + image + " is complete)" : ""));
  }
  // A dump that left them running (--leave-running) with its image complete: they ran on and ended for reasons of
  // their own. The image is found by its name; no record is needed for it.
  if (t.leave_running && is_process_image(t.image)) {
    return runs_on(
        "its processes, which the dump was to leave running (--leave-running), have ended since; the image " + image +
        " is complete");
  }
  std::string why_not;
  // A dump that had not suspended any of them yet (or whose tool undid it) left them as they were: they ended
  // later, for reasons of their own.
  if (!is_process_image(t.image) && !suspended_some(t.staging))
    return runs_on("its processes ended after the dump had let them go");
  if (is_process_image(t.image) || finishable(t.staging, why_not)) {
    o.what = kind::restore;
    o.words = is_process_image(t.image) ? "its processes have ended and the image " + image + " is complete"
                                        : "its processes have ended and the image is complete but for its last "
                                          "step, under " +
                                              jf::printable(t.staging.string());
    o.command = "cuda-ckpt restore " + t.image.string();
    return o;
  }
  o.what = kind::ended;
  o.words = "its processes ended before the image was complete (" + why_not +
            "; killed, or CRIU killed while "
            "its code was in them): nothing of this dump brings them back, an earlier complete image does";
  return o;
}

transaction_outcome assess_restore(const process_transaction& t, const std::vector<pid_t>& alive,
                                   const std::function<bool(pid_t)>& suspended) {
  using kind = transaction_outcome::kind;
  transaction_outcome o;
  if (alive.empty()) {
    o.what = kind::restore;
    o.words = "its processes are gone; the image " + jf::printable(t.image.string()) + " is unchanged";
    o.command = "cuda-ckpt restore " + t.image.string();
    return o;
  }
  const std::vector<pid_t> waiting = waiting_for_gpu(t, alive, suspended);
  if (waiting.empty()) return runs_on("its processes run on");
  return resume_each(waiting, " is back but waits for its GPU memory (from " + jf::printable(t.image.string()) + ")");
}

}  // namespace

bool asks_suspended(pid_t pid) {
  try {
    control_client client(pid, deadline::in(std::chrono::seconds(5)));
    return waits_for_resume(client.hello());
  } catch (const std::exception&) {
    return true;
  }
}

void process_transaction::write() {
  tool_pid = ::getpid();
  tool_start = suspend_claim::start_time(tool_pid);
  const fs::path dir = default_suspend_dir();
  record = dir / (std::string(record_prefix) + op_name(op) + "-" + std::to_string(root_pid) + "-" +
                  std::to_string(tool_pid) + ".json");
  if (!save(*this))
    throw tool_error("cannot record the " + std::string(op_name(op)) + " in " + dir.string() + " (" +
                     std::strerror(errno) +
                     "): without the record a killed tool's processes could not be found "
                     "again; nothing was done");
}

void process_transaction::note_criu(pid_t pid) noexcept {
  criu_pid = pid;
  criu_start = suspend_claim::start_time(pid);
  if (record.empty()) return;
  try {
    save(*this);
  } catch (const std::exception&) {
    // Not encoded (out of memory, say): the record keeps what it said, as when it cannot be written.
  }
}

void process_transaction::remove() const noexcept {
  if (!record.empty()) ::unlink(record.c_str());
}

std::vector<pid_t> process_transaction::alive() const {
  std::vector<pid_t> out;
  for (const auto& [pid, start] : processes) {
    const std::uint64_t now = suspend_claim::start_time(pid);
    const bool ours = op == kind::dump ? now != 0 && now == start : now != 0 && now >= tool_start;
    if (ours) out.push_back(pid);
  }
  return out;
}

std::vector<process_transaction> list_transactions() {
  // Only this user's own records, in its own directory: a record names processes to continue, a CRIU to end and
  // an image to complete, which root must never take from another user's file.
  std::vector<process_transaction> out;
  const fs::path dir = suspend_dir_of(::geteuid());
  struct stat dir_st {};
  if (::lstat(dir.c_str(), &dir_st) != 0 || !S_ISDIR(dir_st.st_mode) || dir_st.st_uid != ::geteuid()) return out;
  {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(record_prefix, 0) != 0 || name.size() < 5 || name.compare(name.size() - 5, 5, ".json") != 0)
        continue;
      struct stat st {};
      if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
      try {
        process_transaction t = decode(read_plain(entry.path(), max_record_bytes));
        t.record = entry.path();
        out.push_back(std::move(t));
      } catch (const std::exception&) {
        // Not a record of ours (or half of one): nothing to act on.
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.record < b.record; });
  return out;
}

transaction_outcome assess(const process_transaction& t, const std::function<bool(pid_t)>& suspended) {
  if (tool_alive(t) || criu_alive(t)) {
    transaction_outcome o;
    o.words = tool_alive(t) ? "under way (its tool, process " + std::to_string(t.tool_pid) + ", runs)"
                            : "under way (its tool died; CRIU, process " + std::to_string(t.criu_pid) +
                                  ", still runs for it: wait for it to end)";
    return o;
  }
  const auto is_suspended = suspended ? suspended : std::function<bool(pid_t)>(asks_suspended);
  const auto alive = t.alive();
  return t.op == process_transaction::kind::dump ? assess_dump(t, alive, is_suspended)
                                                 : assess_restore(t, alive, is_suspended);
}

bool finishable(const fs::path& partial, std::string& why_not) {
  if (partial.empty() || final_name_of(partial).empty()) {
    why_not = "no unfinished image";
    return false;
  }
  struct stat st {};
  if (::lstat(partial.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    why_not = "its unfinished image is gone";
    return false;
  }
  if (staging_writer_alive(partial)) {
    why_not = "its writer still runs";
    return false;
  }
  if (is_process_image(partial)) return true;  // the tool died between process.json and the rename
  if (::lstat((partial / process_intent_name).c_str(), &st) != 0) {
    why_not = "CRIU had not started (no intent record)";
    return false;
  }
  const std::string status = read_plain(partial / criu_dump_status_name, 64);
  if (status != "0\n") {
    why_not = status.empty() ? "CRIU's dump did not finish (it left no exit status in the image)"
                             : "CRIU's dump failed (exit " + status.substr(0, status.find('\n')) + ")";
    return false;
  }
  return true;
}

fs::path finish_process_dump(const fs::path& partial) {
  // One command completes it at a time (a restore and a gc may meet here): the others find it done.
  fs::path final_name = final_name_of(partial);
  const int lock = ::open(partial.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (lock < 0 && is_process_image(final_name)) return final_name;
  struct unlocker {
    int fd;
    ~unlocker() {
      if (fd >= 0) ::close(fd);  // and the lock with it
    }
  } held{lock};
  if (lock >= 0) ::flock(lock, LOCK_EX);
  struct stat st {};
  if (::lstat(partial.c_str(), &st) != 0 && is_process_image(final_name)) return final_name;
  std::string why_not;
  if (!finishable(partial, why_not)) throw tool_error(partial.string() + " cannot be completed: " + why_not);
  // Completing writes into the image: as root, only into one nobody else can have written (docs/security.md).
  if (::geteuid() == 0)
    if (const std::string why = distrust_of(partial); !why.empty())
      throw tool_error(partial.string() + " is not completed: " + why);
  try {
    if (!is_process_image(partial)) {
      process_image d = read_process_intent(partial);
      d.criu_files = describe_criu_files(partial);
      write_process_manifest(partial, d);
    }
    const process_image d = read_process_image(partial);
    verify_process_image(partial, d, false);
    ::unlink((partial / process_intent_name).c_str());
    commit_process_image(partial, final_name);
  } catch (const std::exception&) {
    // Another command (a gc, a restore) completed it at the same time: it is there under its name.
    struct stat st {};
    if (::lstat(partial.c_str(), &st) != 0 && is_process_image(final_name)) return final_name;
    throw;
  }
  return final_name;
}

fs::path find_process_image(const fs::path& name) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(name, ec))) return name;
  fs::path wanted = fs::absolute(name).lexically_normal();
  if (!wanted.has_filename()) wanted = wanted.parent_path();
  for (const auto& entry : fs::directory_iterator(wanted.parent_path(), ec)) {
    std::string why_not;
    if (image::final_name_of_staging(entry.path().filename().string()) == wanted.filename().string() &&
        finishable(entry.path(), why_not))
      return finish_process_dump(entry.path());
  }
  return name;
}

std::vector<fs::path> moved_gpu_parts(pid_t pid, const fs::path& recorded) {
  const fs::path staging = recorded.parent_path().parent_path();
  std::vector<fs::path> candidates;
  auto transactions = list_transactions();
  // The dump that wrote it: its staging name is the recorded one's.
  for (const auto& t : transactions)
    if (t.op == process_transaction::kind::dump && t.staging == staging)
      candidates.push_back(t.image / gpu_dir_name / recorded.filename());
  // Restores that were bringing the process back, the latest first.
  std::sort(transactions.begin(), transactions.end(),
            [](const auto& a, const auto& b) { return a.tool_start > b.tool_start; });
  for (const auto& t : transactions) {
    bool listed = false;
    for (const auto& [p, start] : t.processes) listed = listed || p == pid;
    if (t.op == process_transaction::kind::restore && listed)
      candidates.push_back(t.image / gpu_dir_name / std::to_string(pid));
  }
  // IMAGE.partial-X/gpu/PID, renamed to IMAGE when the dump completed.
  if (const fs::path image = final_name_of(staging); !image.empty())
    candidates.push_back(image / gpu_dir_name / recorded.filename());
  std::vector<fs::path> out;
  for (const auto& c : candidates) {
    struct stat st {};
    if (c != recorded && ::lstat(c.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
        std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  }
  return out;
}

std::string continue_stopped_by_dump(pid_t pid) {
  for (const auto& t : list_transactions()) {
    if (t.op != process_transaction::kind::dump || tool_alive(t)) continue;
    if (criu_alive(t))
      throw tool_error("CRIU (process " + std::to_string(t.criu_pid) + ") still dumps process " +
                       std::to_string(t.root_pid) + " for a tool that died: resume it once CRIU has ended");
    const auto alive = t.alive();
    if (std::find(alive.begin(), alive.end(), pid) == alive.end()) continue;
    bool stopped = false;
    for (pid_t p : alive) stopped = stopped || process_stopped(p);
    if (!stopped) continue;
    for (pid_t p : alive) ::kill(p, SIGCONT);
    return "CRIU had left process " + pids_text(alive) + " stopped (a whole-process dump whose tool died): continued";
  }
  return {};
}

std::vector<std::pair<fs::path, std::string>> settle_transactions(bool dry_run) {
  std::vector<std::pair<fs::path, std::string>> out;
  for (const auto& t : list_transactions()) {
    // A CRIU still dumping processes that are all gone, for a tool that died, would wait for good: ended.
    if (!dry_run && t.op == process_transaction::kind::dump && !tool_alive(t) && criu_alive(t) && t.alive().empty())
      ::kill(-t.criu_pid, SIGKILL);
    const auto o = assess(t);
    std::string why;
    switch (o.what) {
      case transaction_outcome::kind::runs_on:
      case transaction_outcome::kind::ended: why = o.words; break;
      case transaction_outcome::kind::restore:
        // Its image is all that is left: completed where the dump's tool could not (a good image under its
        // name). The record stays: ps goes on naming the restore the program is waiting for, until it runs again.
        if (t.op == process_transaction::kind::dump && !is_process_image(t.image) && !dry_run) {
          try {
            finish_process_dump(t.staging);
          } catch (const std::exception&) {
            // It stays unfinished; `cuda-ckpt restore` completes it, or says why not.
          }
        }
        // Completed now, the image of a dump that was to leave its processes running needs no record (assess_dump).
        if (t.op == process_transaction::kind::dump && t.leave_running && is_process_image(t.image) && !dry_run) {
          why = assess(t).words;
          break;
        }
        continue;
      default: continue;
    }
    if (!dry_run) t.remove();
    out.emplace_back(t.record,
                     "the record of a whole-process " + std::string(op_name(t.op)) + " whose tool died: " + why);
  }
  return out;
}

}  // namespace vmmckpt::ckpt
