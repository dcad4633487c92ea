// cuda-ckpt dump --process: suspend (the shim), checkpoint what is left of each context (the driver), then
// `criu dump --leave-stopped`, into one whole-process image; a transaction that cannot lose the program.
//
// The program is never ended by CRIU: CRIU leaves it stopped, and only once the image is complete, synced and
// under its name does this tool end it (or, with --leave-running, let it go on). Until then every failure is
// undone (the program continued, its context restored, its GPU memory given back), and a tool killed at any
// moment leaves the program alive, stopped or suspended, with a record that `cuda-ckpt ps` and `resume` read
// (process_recovery.hpp). The image's intent record, written before CRIU runs, completes the image should the
// program be lost afterwards anyway (killed by someone while stopped).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "vmmckpt/ckpt/driver_checkpoint.hpp"
#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/image/staging_name.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

using clock = std::chrono::steady_clock;

// The driver's lock waits for CUDA calls under way to return; the shim's gate has stopped new ones.
constexpr unsigned driver_lock_timeout_ms = 10'000;

// A process of the tree stopped by a signal (docs/whole-process.md, "A stopped program"): CRIU would dump it stopped,
// and restored it would stay stopped, never loading its GPU memory. The dump refuses it instead.
struct stopped_program : tool_error {
  using tool_error::tool_error;
};

std::string who(pid_t pid) {
  const std::string name = short_name_of(pid);
  return "process " + std::to_string(pid) + (name.empty() ? "" : " (" + name + ")");
}

void require_running_for_driver(pid_t pid) {
  if (const auto state = driver_process_state(pid); state != CU_PROCESS_STATE_RUNNING)
    throw tool_error(who(pid) + " is " + process_state_name(state) +
                     " for the driver: another checkpoint is under way, or one stopped midway (`cuda-ckpt resume " +
                     std::to_string(pid) + "` brings it back)");
}

struct tree_member {
  pid_t pid = 0;
  pid_t parent = 0;
  std::vector<std::string> command;
};

// The processes under the shim in root's tree (each gets a GPU part), after refusing a tree whose GPU
// state cannot be captured: a process that uses CUDA without the shim, or a multi-rank NCCL job. Each is given
// `wait` to answer: a process on a busy machine (or one loading its memory after a restore) may take more than
// the second that ps gives it. `driver_only`: the processes under the shim with the driver initialized but no
// memory served (no control server), whose driver state only the driver's checkpoint takes.
std::vector<tree_member> gpu_members_of(pid_t root, std::chrono::milliseconds wait, bool job,
                                        std::vector<pid_t>& driver_only) {
  if (!process_exists(root)) throw tool_error("no process " + std::to_string(root));
  require_own_process(root);  // another user's tree reads as one without the shim: said as what it is
  std::vector<tree_member> members;
  int nccl = 0;
  for (const pid_t pid : process_tree(root)) {
    if (shim_in(pid) != shim_presence::loaded) {
      if (maps_file(pid, "libcuda.so"))
        throw tool_error(who(pid) + ", in the tree of process " + std::to_string(root) +
                         ", uses CUDA without vmmckpt: its GPU memory cannot be checkpointed. Run it under vmmckpt "
                         "(cuda-ckpt run, or LD_PRELOAD=libvmmckpt.so) too");
      continue;  // CPU only: CRIU takes it whole
    }
    const auto entry = list_processes(pid, wait).front();
    if (!entry.hello) {
      // The shim stepped aside (a fork() child) or has not started its server (no memory served): no GPU memory
      // of the shim's. A launcher that counted the GPUs has the driver's device files open, which CRIU cannot
      // take: the driver's checkpoint closes them. CRIU takes the rest, or says what it cannot.
      if (entry.status == "no control server") {
        if (maps_file(pid, "libcuda.so")) driver_only.push_back(pid);
        continue;
      }
      throw tool_error(who(pid) + " is " + entry.status + ": " + entry.problem);
    }
    if (maps_file(pid, "libnccl")) ++nccl;
    members.push_back({pid, parent_of(pid), entry.hello->command});
  }
  if (nccl > 1 && !job)
    throw tool_error("process " + std::to_string(root) + "'s tree is a multi-rank NCCL job (" + std::to_string(nccl) +
                     " processes load NCCL): checkpoint it as a job, its ranks cut at one point (dump --job "
                     "--process)");
  if (members.empty())
    throw tool_error("no process in the tree of process " + std::to_string(root) +
                     " runs under vmmckpt with CUDA in use: nothing of the GPU to checkpoint (use criu alone)");
  return members;
}

// A process that a dump whose tool died left stopped (CRIU's --leave-stopped) has its own way back, not `kill -CONT`.
void refuse_left_stopped(pid_t pid) {
  for (const auto& t : list_transactions()) {
    const auto alive = t.alive();
    if (t.op != process_transaction::kind::dump || std::find(alive.begin(), alive.end(), pid) == alive.end()) continue;
    const auto o = assess(t, [](pid_t) { return true; });  // not asked: stopped, it would not answer
    if (o.what == transaction_outcome::kind::resume)
      throw tool_error(who(pid) + " is stopped by a whole-process dump whose tool died: `" + o.command +
                       "` brings it back");
  }
}

// CRIU refuses a tree with a connection to a process outside it: a client of a control socket (a `cuda-ckpt
// ps`) is one, for the moment it is served. The dump tries again, twice: a connection that is still there
// then is the program's own, and each try costs CRIU's whole pass.
constexpr int external_socket_attempts = 3;
constexpr useconds_t external_socket_pause_us = 500'000;

void check_interrupted(const copy_settings& copy) {
  if (copy.interrupt == nullptr) return;
  if (const int sig = copy.interrupt->load(); sig != 0) throw interrupted("interrupted", sig);
}

// The parent of an incremental image: a whole-process image checked whole, CPU part included (each CRIU file's
// checksum, each GPU part's chain as the image it names), before anything is touched.
process_image checked_parent(const fs::path& given, fs::path& parent) {
  parent = fs::absolute(given).lexically_normal();
  if (!parent.has_filename()) parent = parent.parent_path();
  if (!is_process_image(parent))
    throw image::image_error(given.string() + ": not a whole-process image (no " + process_manifest_name +
                             "); the parent of dump --process is an image written by dump --process");
  process_image d = read_process_image(parent);
  verify_process_image(parent, d, false);
  return d;
}

// One dump --process, step by step; what it did is undone in reverse when a step before the commit fails.
class process_dump {
 public:
  process_dump(const process_dump_options& o, const progress_callback& progress, process_dump_result& r)
      : o_(o), progress_(progress), r_(r), d_(r.description) {}

  void check_and_prepare();
  void pre_copy_all();
  void suspend_all();
  void checkpoint_contexts();
  void criu_dump();
  void commit();
  void finish();
  // After a failure before the commit: the processes back running, the unfinished image removed. What could
  // not be undone, in words ("" when everything was).
  std::string undo();
  double elapsed() const { return seconds_since(start_); }

  void mark(const char* step) { r_.phases.emplace_back(step, seconds_since(start_)); }
  static double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

 private:
  // check_and_prepare's steps: the refusals, the image's place (and its parent), the transaction's record and
  // the staging directory, the image's description of the tree.
  void check_dumpable();
  void check_destination();
  void open_record();
  void describe_tree();
  void pre_copy_one(const tree_member& m, process_image::member& described);
  void suspend_one(const tree_member& m, process_image::member& described);
  void suspend_job_ranks();
  // The copy settings of m's dumps: incremental on its part in the parent image, if that has one.
  copy_settings copy_for(pid_t pid) const;
  // The steps of an operation on pid called at `called` ("pre-copy", "suspend"), on this dump's clock: where
  // the time of the GPU part went. Returns when its step "held" ended (-1: it had none).
  double take_phases(const char* what, pid_t pid, clock::time_point called,
                     const std::vector<std::pair<std::string, double>>& phases);
  void continue_stopped();
  // Refuses the dump when any of `stopped` (processes of the tree stopped by a signal) is there; the undo then
  // gives each its GPU memory back and leaves it stopped, as it was.
  void refuse_stopped(const std::vector<pid_t>& stopped);
  std::vector<pid_t> tree_pids() const;

  const process_dump_options& o_;
  const progress_callback& progress_;
  process_dump_result& r_;
  process_image& d_;
  const clock::time_point start_ = clock::now();
  criu_tool criu_;
  std::vector<tree_member> members_;
  fs::path output_, staging_, parent_;
  process_image parent_description_;
  process_transaction record_;
  std::vector<pid_t> suspended_, locked_, checkpointed_;
  std::vector<pid_t> dumped_;  // the tasks CRIU dumped and left stopped (its pstree.img)
  // With pre-copy, a process's pre-copy and its suspend are a series (copy_settings::reuse): the suspend
  // takes the pinned staging, the checksum kernel (of its device's context) and its parent's blocks from
  // memory, at once. One per process, let go after its suspend.
  std::map<pid_t, std::shared_ptr<copy_reuse>> reuse_;
  bool stopped_ = false;                  // CRIU left them stopped
  std::vector<pid_t> stopped_by_signal_;  // by someone else: stopped again once undone
  bool committed_ = false;
  double stopped_from_ = -1;  // when the first process was held, in seconds from the start
};

void process_dump::check_and_prepare() {
  check_dumpable();
  check_destination();
  open_record();
  mark("checked");
  describe_tree();
}

// Everything that can refuse does so before a process is touched.
void process_dump::check_dumpable() {
  if (const std::string missing = driver_checkpoint_missing(); !missing.empty())
    throw tool_error(missing + ": whole-process checkpoints need it (dump, suspend and restore with a command work "
                               "without it)");
  if (o_.job && (o_.pre_copy || !o_.parent.empty()))
    throw tool_error("--pre-copy and --parent do not apply to a whole job's dump (--job) yet");
  if (!process_exists(o_.pid)) throw tool_error("no process " + std::to_string(o_.pid));
  require_own_process(o_.pid);  // another user's program is said to be so, before what this user may run
  criu_ = find_criu();
  // At once: asked, a stopped process would never answer.
  const auto stopped = stopped_among(process_tree(o_.pid));
  if (!stopped.empty()) refuse_left_stopped(stopped.front());
  refuse_stopped(stopped);
  members_ = gpu_members_of(o_.pid, member_wait_within(o_.hold_deadline), o_.job, d_.driver_only);
  for (const pid_t pid : d_.driver_only) require_running_for_driver(pid);
  for (const auto& m : members_) require_running_for_driver(m.pid);
}

void process_dump::check_destination() {
  output_ = fs::absolute(o_.output).lexically_normal();
  if (output_.filename().empty()) throw tool_error("the image needs a directory name, not " + o_.output.string());
  if (!o_.parent.empty()) parent_description_ = checked_parent(o_.parent, parent_);
  std::error_code ec;
  if (fs::symlink_status(output_, ec).type() != fs::file_type::not_found)
    throw image::image_error(output_.string() + " already exists");
}

// The record first: from here on a killed tool's processes can be found and brought back.
void process_dump::open_record() {
  record_.op = process_transaction::kind::dump;
  record_.root_pid = o_.pid;
  for (const pid_t pid : process_tree(o_.pid)) record_.processes.emplace_back(pid, suspend_claim::start_time(pid));
  for (const auto& m : members_) record_.gpu_pids.push_back(m.pid);
  record_.image = output_;
  record_.leave_running = o_.leave_running;
  settle_transactions(false);  // older records that need nothing more go, so that ps shows only what matters
  // The parts are written under this name, next to the final one (renamed in one step at the end).
  staging_ = image::staging_path(output_);
  record_.staging = staging_;
  record_.write();
  // A job's suspend makes gpu/ itself, as the job's directory it settles the ranks' suspend in.
  std::error_code ec;
  if (!fs::create_directories(o_.job ? staging_ : staging_ / gpu_dir_name, ec) || ec) {
    record_.remove();
    throw image::image_error(staging_.string() + ": cannot be created: " + ec.message());
  }
  ::chmod(staging_.c_str(), 0700);
}

void process_dump::describe_tree() {
  for (const auto& m : members_) d_.processes.push_back({m.pid, m.parent, m.command, "", false, ""});
  d_.root_pid = o_.pid;
  d_.criu_version = criu_.version;
  d_.left_running = o_.leave_running;
  d_.job = o_.job;
  if (!parent_.empty()) d_.parent = parent_.lexically_relative(output_.parent_path()).string();
}

copy_settings process_dump::copy_for(pid_t pid) const {
  copy_settings copy = o_.copy;
  if (const auto it = reuse_.find(pid); it != reuse_.end()) copy.reuse = it->second;
  for (const auto& p : parent_description_.processes)
    if (p.pid == pid) {
      copy.parent = parent_description_.gpu_image(parent_, pid);
      // Named from gpu/ of this image (and of its staging name, a sibling): moved together, both hold.
      copy.parent_recorded_as = copy.parent.lexically_relative(output_ / gpu_dir_name);
      copy.parent_in_process_image = is_process_image_part(copy.parent);
    }
  return copy;
}

double process_dump::take_phases(const char* what, pid_t pid, clock::time_point called,
                                 const std::vector<std::pair<std::string, double>>& phases) {
  const double offset = std::chrono::duration<double>(called - start_).count();
  double held = -1;
  for (const auto& [step, at] : phases) {
    r_.phases.emplace_back(std::string(what) + " " + std::to_string(pid) + " " + step, offset + at);
    if (step == "held") held = offset + at;
  }
  return held;
}

void process_dump::pre_copy_one(const tree_member& m, process_image::member& described) {
  dump_options so;
  so.pid = m.pid;
  so.output = d_.pre_copy_image(staging_, m.pid);
  so.copy = copy_for(m.pid);
  so.hold_deadline = o_.hold_deadline;
  so.allow_partial = true;  // as its suspend: what the shim does not own, the driver checkpoints
  const auto called = clock::now();
  const auto r = dump(so, progress_);
  take_phases("pre-copy", m.pid, called, r.phases);
  described.pre_copy_image_id = r.manifest.image_id;
  d_.gpu_bytes += r.manifest.data_bytes;
  r_.pre_copy_bytes += r.manifest.data_bytes;
  r_.pre_copy_held_ms = std::max(r_.pre_copy_held_ms, r.hold_ms);
}

void process_dump::pre_copy_all() {
  // 0. While the processes run, a dump of each one's GPU memory (each held only as a dump holds it): the
  // parent of the part its suspend writes, which then copies out only the blocks changed since.
  for (std::size_t i = 0; i < members_.size(); ++i) {
    reuse_[members_[i].pid] = make_copy_reuse();
    pre_copy_one(members_[i], d_.processes[i]);
  }
  mark("pre-copied");
  fault_point("process:pre-copied");
  check_interrupted(o_.copy);
}

void process_dump::suspend_one(const tree_member& m, process_image::member& described) {
  suspend_options so;
  so.pid = m.pid;
  so.output = d_.gpu_image(staging_, m.pid);
  so.copy = copy_for(m.pid);
  if (!described.pre_copy_image_id.empty()) {
    so.copy.parent = d_.pre_copy_image(staging_, m.pid);
    so.copy.parent_recorded_as = so.copy.parent.filename();  // beside it in gpu/, wherever the image goes
    so.copy.parent_in_process_image = is_process_image_part(so.copy.parent);
  }
  so.hold_deadline = o_.hold_deadline;
  so.allow_partial = true;  // what the shim does not own stays in the context: the driver checkpoints it
  const auto called = clock::now();
  const auto s = suspend(so, progress_);
  suspended_.push_back(m.pid);
  reuse_.erase(m.pid);  // its pinned staging goes before the next process's suspend
  if (s.late) throw tool_error(who(m.pid) + " took the suspend but did not answer in time (stopped?)");
  // Its mapping of another process's memory would be in the driver's checkpoint of it, and that memory
  // is not in the image: not supported (docs/ipc.md).
  if (!s.manifest.ipc_imports.empty())
    throw tool_error(
        who(m.pid) + " maps GPU memory of process " + std::to_string(s.manifest.ipc_imports.front().exporter_pid) +
        " through CUDA IPC: whole-process images of processes that share memory that way are not supported");
  if (d_.created.empty()) {
    d_.tool_version = s.manifest.tool_version;
    d_.created = s.manifest.created;
    d_.host = s.manifest.host;
  }
  if (const double held = take_phases("suspend", m.pid, called, s.phases); held >= 0 && stopped_from_ < 0)
    stopped_from_ = held;
  d_.gpu_bytes += s.manifest.data_bytes;
  r_.held_bytes += s.manifest.data_bytes;
  described.image_id = s.manifest.image_id;
}

void process_dump::suspend_job_ranks() {
  job_suspend_options so;
  for (const auto& m : members_) so.job.ranks.push_back(m.pid);
  so.output = staging_ / gpu_dir_name;
  so.copy = o_.copy;
  so.hold_deadline = o_.hold_deadline;
  so.allow_partial = true;  // what the shim does not own stays in the contexts: the driver checkpoints it
  const auto called = clock::now();
  const auto s = suspend_job(so);
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    const suspend_result& one = s.suspends[i];
    suspended_.push_back(s.ranks[i]);
    if (const double held = take_phases("suspend", s.ranks[i], called, one.phases); held >= 0 && stopped_from_ < 0)
      stopped_from_ = held;
    // The job's ranks come in pid order, process.json's in the tree's: matched by pid.
    for (auto& m : d_.processes)
      if (m.pid == s.ranks[i]) m.image_id = one.manifest.image_id;
    d_.gpu_bytes += one.manifest.data_bytes;
    r_.held_bytes += one.manifest.data_bytes;
    d_.tool_version = one.manifest.tool_version;
    d_.created = one.manifest.created;
    d_.host = one.manifest.host;
  }
  r_.phases.emplace_back("cut", std::chrono::duration<double>(called - start_).count() + s.cut.seconds);
}

void process_dump::suspend_all() {
  // 1. The shim copies each process's GPU memory out (with pre-copy, what changed since) and frees it; each
  // stays held. A job's ranks are first brought to one point of the job, and suspended all or none.
  if (o_.job)
    suspend_job_ranks();
  else
    for (std::size_t i = 0; i < members_.size(); ++i) suspend_one(members_[i], d_.processes[i]);
  mark("suspended");
  fault_point("process:suspended");
  check_interrupted(o_.copy);
}

void process_dump::refuse_stopped(const std::vector<pid_t>& stopped) {
  if (stopped.empty()) return;
  stopped_by_signal_ = stopped;
  throw stopped_program(stopped_refusal(stopped.front(), "dump again"));
}

std::vector<pid_t> process_dump::tree_pids() const {
  std::vector<pid_t> pids;
  for (const auto& [pid, start] : record_.processes) pids.push_back(pid);
  return pids;
}

void process_dump::checkpoint_contexts() {
  // 2. The driver checkpoints what is left of each context, and closes its device files; then those of the
  // processes that only initialized it. A process stopped meanwhile would keep the driver's lock waiting.
  refuse_stopped(stopped_among(tree_pids()));
  for (const pid_t pid : d_.driver_only) {
    driver_lock(pid, driver_lock_timeout_ms);
    locked_.push_back(pid);
    driver_checkpoint(pid);
    checkpointed_.push_back(pid);
  }
  for (auto& m : d_.processes) {
    driver_lock(m.pid, driver_lock_timeout_ms);
    locked_.push_back(m.pid);
    fault_point("process:locked");
    driver_checkpoint(m.pid);
    checkpointed_.push_back(m.pid);
    m.driver_checkpointed = true;
  }
  mark("driver checkpointed");
  fault_point("process:checkpointed");
  check_interrupted(o_.copy);
}

void process_dump::criu_dump() {
  // 3. The intent record, then CRIU: the CPU side of the whole tree, left stopped (never ended by CRIU).
  write_process_intent(staging_, d_);
  fault_point("process:intent");
  // Stopped by a signal now, a process would be dumped stopped. Once CRIU runs, its own stop cannot be told from
  // another: what CRIU recorded of each task is checked after it (below).
  refuse_stopped(stopped_among(tree_pids()));
  fs::create_directory(staging_ / criu_dir_name);
  std::vector<std::string> args{
      "dump",           "-t", std::to_string(o_.pid), "-D", (staging_ / criu_dir_name).string(), "--shell-job",
      "--leave-stopped"};
  args.insert(args.end(), o_.criu_args.begin(), o_.criu_args.end());
  // A job's ranks talk over TCP (NCCL's bootstrap, the launcher's store): CRIU keeps the connections.
  if (o_.job || std::find(args.begin(), args.end(), criu_tcp_established) != args.end()) add_tcp_established(args);
  fault_point("process:criu");
  // Its exit status is written into the image by the shell that runs it, tool or no tool: "0" tells a later
  // `restore` or `gc` that CRIU's part is complete.
  const fs::path log = staging_ / criu_dump_log_name;
  int status = 0;
  for (int attempt = 1;; ++attempt) {
    // A CRIU whose process died under it can wait for good: 5 s after the root is gone it is ended.
    auto gone_since = clock::time_point::max();
    status = run_criu(
        criu_, args, log,
        [&](pid_t criu) {
          record_.note_criu(criu);
          fault_point("process:criu-running");
        },
        staging_ / criu_dump_status_name,
        [&] {
          if (process_alive(o_.pid)) return false;
          if (gone_since == clock::time_point::max()) gone_since = clock::now();
          return clock::now() - gone_since > std::chrono::seconds(5);
        });
    // Stopped or not, CRIU has let go of them: whatever follows must continue them (or end them).
    stopped_ = true;
    if (status == 0 || attempt == external_socket_attempts || !criu_log_mentions(log, "External socket is used")) break;
    // A client of a process's control socket (a `cuda-ckpt ps`, say) was connected at that moment, and CRIU
    // cannot take half a connection: it left the tree as it was. Such a client goes within a moment.
    continue_stopped();
    std::error_code ec;
    fs::remove_all(staging_ / criu_dir_name, ec);
    fs::create_directory(staging_ / criu_dir_name, ec);
    ::usleep(external_socket_pause_us);
    check_interrupted(o_.copy);
  }
  if (status != 0)
    throw tool_error(
        "criu dump failed (exit " + std::to_string(status) + "):" + criu_log_excerpt(log) +
        (criu_log_mentions(log, "io_uring")
             ? "\n(a process of the tree uses io_uring, which CRIU cannot dump: libuv does, as in PyTorch's "
               "TCPStore that torchrun hosts; start the job with `cuda-ckpt run`, which refuses io_uring to it, "
               "without "
               "VMMCKPT_ALLOW_IO_URING=1)"
             : ""));
  dumped_ = read_criu_pstree(staging_ / criu_dir_name).pids;
  refuse_stopped(criu_stopped_tasks(staging_ / criu_dir_name, dumped_));  // stopped before CRIU seized it
  d_.stopped_seconds = seconds_since(start_) - stopped_from_;
  mark("criu dumped");
  fault_point("process:criu-dumped");
  check_interrupted(o_.copy);
}

void process_dump::commit() {
  // 4. The manifest over both parts; the image appears under its name in one step.
  d_.criu_files = describe_criu_files(staging_);
  write_process_manifest(staging_, d_);
  fault_point("process:written");
  std::error_code ec;
  fs::remove(staging_ / process_intent_name, ec);
  commit_process_image(staging_, output_);
  committed_ = true;
  mark("committed");
  fault_point("process:committed");
}

void process_dump::continue_stopped() {
  if (!stopped_) return;
  for (const auto& [pid, start] : record_.processes)
    if (suspend_claim::alive(pid, start)) ::kill(pid, SIGCONT);
  stopped_ = false;
}

void process_dump::finish() {
  // 5. The image is complete: the processes end, as with `criu dump`, or with --leave-running go on, each
  // with its context back, then its GPU memory.
  if (!o_.leave_running) {
    // Descendants first and the root last, each seen dead before the next (as CRIU would end them): when the
    // root is seen gone, so is the tree, and a restore right after finds every pid free once they are reaped.
    for (auto it = dumped_.rbegin(); it != dumped_.rend(); ++it) {
      ::kill(*it, SIGKILL);
      for (int i = 0; i < 200 && process_alive(*it); ++i) ::usleep(10'000);
    }
    stopped_ = false;
    suspended_.clear();
    locked_.clear();
    checkpointed_.clear();
    record_.remove();
    return;
  }
  continue_stopped();
  try {
    // Every context back from the driver, the last checkpointed first; then the GPU memory, each part renamed with
    // the image (a job's ranks load theirs together, then each maps the others').
    for (; !checkpointed_.empty(); checkpointed_.pop_back()) driver_restore(checkpointed_.back());
    for (; !locked_.empty(); locked_.pop_back()) driver_unlock(locked_.back());
    if (o_.job) {
      resume_job({0, suspended_}, output_ / gpu_dir_name);
      suspended_.clear();
    }
    for (; !suspended_.empty(); suspended_.pop_back())
      request_resume(suspended_.back(), d_.gpu_image(output_, suspended_.back()), progress_);
  } catch (const std::exception& e) {
    // The record stays: `cuda-ckpt ps` names the way back, and `resume` or `restore` takes it.
    const pid_t pid = suspended_.empty() ? o_.pid : suspended_.back();
    if (!process_alive(pid))
      throw tool_error(std::string(e.what()) + "; the image " + output_.string() + " is complete, and process " +
                       std::to_string(pid) + " ended meanwhile (killed?): `cuda-ckpt restore " + output_.string() +
                       "` brings it back");
    throw tool_error(std::string(e.what()) + "; the image " + output_.string() +
                     " is complete, but the process did not come back: `cuda-ckpt resume " + std::to_string(pid) +
                     "` brings it back");
  }
  record_.remove();
  d_.stopped_seconds = seconds_since(start_) - stopped_from_;
  mark("resumed");
}

std::string process_dump::undo() {
  std::string problems;
  bool needed = false;  // a process lives that could not be brought back: the record and the parts stay for it
  auto attempt = [&](pid_t pid, auto&& step) {
    if (!process_alive(pid)) return;  // said below
    try {
      step();
    } catch (const std::exception& e) {
      if (!process_alive(pid)) return;  // it ended meanwhile: said below
      needed = true;
      problems += "; " + std::string(e.what()) + " (run `cuda-ckpt resume " + std::to_string(pid) + "`)";
    }
  };
  // A process stopped by a signal is continued for its GPU memory to come back, then stopped again.
  auto signal_stopped = [&](int sig) {
    for (const auto& [pid, start] : record_.processes)
      if (std::find(stopped_by_signal_.begin(), stopped_by_signal_.end(), pid) != stopped_by_signal_.end() &&
          suspend_claim::alive(pid, start))
        ::kill(pid, sig);
  };
  signal_stopped(SIGCONT);
  continue_stopped();
  for (auto it = checkpointed_.rbegin(); it != checkpointed_.rend(); ++it) attempt(*it, [&] { driver_restore(*it); });
  for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) attempt(*it, [&] { driver_unlock(*it); });
  if (o_.job && !suspended_.empty())
    attempt(suspended_.front(), [&] { resume_job({0, suspended_}); });
  else
    for (auto it = suspended_.rbegin(); it != suspended_.rend(); ++it) attempt(*it, [&] { request_resume(*it, {}); });
  // A process that ended meanwhile has nothing to come back to from this dump. CRIU killed while its code was
  // in the process (injecting or removing it) ends it with SIGTRAP: only its last complete image brings it back.
  for (const auto& [pid, start] : record_.processes)
    if (start != 0 && !suspend_claim::alive(pid, start))
      problems += "; process " + std::to_string(pid) +
                  " ended during the dump (killed, or CRIU was killed while its "
                  "code was in it): nothing of this dump can bring it back, its last complete image can";
  signal_stopped(SIGSTOP);
  std::error_code ec;
  if (!needed) {
    fs::remove_all(staging_, ec);
    record_.remove();  // nothing is left to come back to
  }
  return problems;
}

}  // namespace

process_dump_result dump_process(const process_dump_options& o, const progress_callback& progress) {
  process_dump_result r;
  process_dump dump(o, progress, r);
  dump.check_and_prepare();
  try {
    if (o.pre_copy) dump.pre_copy_all();
    dump.suspend_all();
    dump.checkpoint_contexts();
    dump.criu_dump();
    dump.commit();
  } catch (const std::exception& e) {
    const std::string problems = dump.undo();
    if (const auto* i = dynamic_cast<const interrupted*>(&e)) {
      if (problems.empty()) throw;
      throw interrupted(std::string(i->what()) + problems, i->signal);
    }
    if (problems.empty() && dynamic_cast<const stopped_program*>(&e) != nullptr)
      throw tool_error(std::string(e.what()) + "; nothing was written, its GPU memory is back, and it is left stopped");
    if (problems.empty())
      throw tool_error(std::string(e.what()) + "; nothing was written, and the process goes on as before");
    throw tool_error(std::string(e.what()) + problems);
  }
  dump.finish();
  r.image = fs::absolute(o.output).lexically_normal();
  r.seconds = dump.elapsed();
  return r;
}

}  // namespace vmmckpt::ckpt
