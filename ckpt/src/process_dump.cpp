// cuda-ckpt dump --process: suspend (the shim), checkpoint what is left of each context (the driver),
// then `criu dump`, into one whole-process image; any failure brings the processes back running.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include "driver_checkpoint.hpp"
#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/fault_point.hpp"
#include "vmmckpt/hex_text.hpp"
#include "vmmckpt/image.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

using clock = std::chrono::steady_clock;

// The driver's lock waits for CUDA calls under way to return; the shim's gate has stopped new ones.
constexpr unsigned driver_lock_timeout_ms = 10'000;

std::string who(pid_t pid) {
  const std::string name = short_name_of(pid);
  return "process " + std::to_string(pid) + (name.empty() ? "" : " (" + name + ")");
}

struct tree_member {
  pid_t pid = 0;
  pid_t parent = 0;
  std::vector<std::string> command;
};

// The processes under the shim in root's tree (each gets a GPU part), after refusing a tree whose GPU
// state cannot be captured: a process that uses CUDA without the shim, or a multi-rank NCCL job.
std::vector<tree_member> gpu_members_of(pid_t root) {
  if (!process_exists(root)) throw tool_error("no process " + std::to_string(root));
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
    const auto entry = list_processes(pid).front();
    if (!entry.hello) {
      // The shim stepped aside (a fork() child) or has not started its server (no CUDA call yet):
      // no GPU state of the shim's; CRIU takes the rest, or says what it cannot.
      if (entry.status == "no control server") continue;
      throw tool_error(who(pid) + " is " + entry.status + ": " + entry.problem);
    }
    if (maps_file(pid, "libnccl")) ++nccl;
    members.push_back({pid, parent_of(pid), entry.hello->command});
  }
  if (nccl > 1)
    throw tool_error("process " + std::to_string(root) + "'s tree is a multi-rank NCCL job (" + std::to_string(nccl) +
                     " processes load NCCL): whole-process checkpoints of NCCL peers are not supported (the driver's "
                     "checkpoint does not cover NCCL's peer connections); dump each rank's GPU memory instead");
  if (members.empty())
    throw tool_error("no process in the tree of process " + std::to_string(root) +
                     " runs under vmmckpt with CUDA in use: nothing of the GPU to checkpoint (use criu alone)");
  return members;
}

void check_interrupted(const copy_settings& copy) {
  if (copy.interrupt == nullptr) return;
  if (const int sig = copy.interrupt->load(); sig != 0) throw interrupted("interrupted", sig);
}

// What the dump has done to the processes, undone in reverse when it fails: they must go on unharmed.
struct done_so_far {
  std::vector<pid_t> suspended, locked, checkpointed;
  fs::path staging;
  bool keep_staging = false;  // the processes are gone (CRIU ended them): their parts stay, named

  // Brings every process back running and removes the unfinished image; returns what could not be
  // undone, in words ("" when everything was).
  std::string undo() {
    std::string problems;
    auto attempt = [&](pid_t pid, auto&& step) {
      try {
        step();
      } catch (const std::exception& e) {
        problems += "; " + std::string(e.what()) + " (run `cuda-ckpt resume " + std::to_string(pid) + "`)";
      }
    };
    for (auto it = checkpointed.rbegin(); it != checkpointed.rend(); ++it) attempt(*it, [&] { driver_restore(*it); });
    for (auto it = locked.rbegin(); it != locked.rend(); ++it) attempt(*it, [&] { driver_unlock(*it); });
    for (auto it = suspended.rbegin(); it != suspended.rend(); ++it) attempt(*it, [&] { resume(*it); });
    std::error_code ec;
    if (!keep_staging) fs::remove_all(staging, ec);
    return problems;
  }
};

}  // namespace

process_dump_result dump_process(const process_dump_options& o, const progress_callback& progress) {
  process_dump_result r;
  const auto start = clock::now();
  auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  auto mark = [&](const char* step) { r.phases.emplace_back(step, seconds_since(start)); };

  // Everything that can refuse does so before a process is touched.
  const criu_tool criu = find_criu();
  if (const std::string missing = driver_checkpoint_missing(); !missing.empty())
    throw tool_error(missing + ": whole-process checkpoints need it (dump, suspend and restore with a command work "
                               "without it)");
  const auto members = gpu_members_of(o.pid);
  for (const auto& m : members)
    if (const auto state = driver_process_state(m.pid); state != CU_PROCESS_STATE_RUNNING)
      throw tool_error(who(m.pid) + " is " + process_state_name(state) +
                       " for the driver: another checkpoint is under way, or one stopped midway (`cuda-ckpt resume " +
                       std::to_string(m.pid) + "` brings it back)");
  const fs::path output = fs::absolute(o.output).lexically_normal();
  if (output.filename().empty()) throw tool_error("the image needs a directory name, not " + o.output.string());
  // An incremental image: its parent must be a whole-process image whose GPU parts open (each with its
  // chain, as the image it names) before anything is touched. Its CPU part is not read.
  fs::path parent;
  process_image parent_description;
  if (!o.parent.empty()) {
    parent = fs::absolute(o.parent).lexically_normal();
    if (!parent.has_filename()) parent = parent.parent_path();
    if (!is_process_image(parent))
      throw image::image_error(o.parent.string() + ": not a whole-process image (no " + process_manifest_name +
                               "); the parent of dump --process is an image written by dump --process");
    parent_description = read_process_image(parent);
    for (const auto& p : parent_description.processes) {
      const fs::path part = parent_description.gpu_image(parent, p.pid);
      if (image::reader::open(part).info().image_id != p.image_id)
        throw image::image_error(part.string() + ": not the GPU part " + process_manifest_name + " names (image " +
                                 p.image_id + ")");
    }
  }
  std::error_code ec;
  if (fs::symlink_status(output, ec).type() != fs::file_type::not_found)
    throw image::image_error(output.string() + " already exists");
  // The parts are written under this name, next to the final one (renamed in one step at the end);
  // `cuda-ckpt gc` knows the .partial- form.
  done_so_far done;
  done.staging = output.parent_path() / (output.filename().string() + ".partial-" + std::to_string(::getpid()) + "-" +
                                         random_hex16());
  if (!fs::create_directories(done.staging / gpu_dir_name, ec) || ec)
    throw image::image_error(done.staging.string() + ": cannot be created: " + ec.message());
  ::chmod(done.staging.c_str(), 0700);
  mark("checked");

  process_image& d = r.description;
  d.root_pid = o.pid;
  d.criu_version = criu.version;
  d.left_running = o.leave_running;
  if (!parent.empty()) d.parent = parent.lexically_relative(output.parent_path()).string();
  const fs::path criu_log = fs::temp_directory_path() / ("cuda-ckpt-criu-dump-" + std::to_string(o.pid) + "-" +
                                                         random_hex16() + ".log");
  try {
    // 1. The shim copies each process's GPU memory out and frees it; each stays held.
    double stopped_from = -1;  // when the first process was held, in seconds from the start
    for (const auto& m : members) {
      suspend_options so;
      so.pid = m.pid;
      so.output = d.gpu_image(done.staging, m.pid);
      so.copy = o.copy;
      if (!parent.empty()) {
        for (const auto& p : parent_description.processes)
          if (p.pid == m.pid) {
            so.copy.parent = parent_description.gpu_image(parent, m.pid);
            // Named from gpu/ of this image (and of its staging name, a sibling): moved together, both hold.
            so.copy.parent_recorded_as = so.copy.parent.lexically_relative(output / gpu_dir_name);
          }
      }
      so.hold_deadline_ms = o.hold_deadline_ms;
      so.allow_partial = true;  // what the shim does not own stays in the context: the driver checkpoints it
      const auto called = clock::now();
      const auto s = suspend(so, progress);
      done.suspended.push_back(m.pid);
      if (s.late) throw tool_error(who(m.pid) + " took the suspend but did not answer in time (stopped?)");
      // Its mapping of another process's memory would be in the driver's checkpoint of it, and that memory
      // is not in the image: not supported (docs/ipc.md).
      if (!s.manifest.ipc_imports.empty())
        throw tool_error(who(m.pid) + " maps GPU memory of process " + std::to_string(s.manifest.ipc_imports.front().exporter_pid) +
                         " through CUDA IPC: whole-process images of processes that share memory that way are not supported");
      if (d.created.empty()) {
        d.tool_version = s.manifest.tool_version;
        d.created = s.manifest.created;
        d.host = s.manifest.host;
      }
      // The suspend's own steps, on this dump's clock: where the time of the GPU part went.
      const double offset = std::chrono::duration<double>(called - start).count();
      for (const auto& [step, at] : s.phases) {
        r.phases.emplace_back("suspend " + std::to_string(m.pid) + " " + step, offset + at);
        if (step == "held" && stopped_from < 0) stopped_from = offset + at;
      }
      d.gpu_bytes += s.manifest.data_bytes;
      d.processes.push_back({m.pid, m.parent, m.command, s.manifest.image_id, false});
    }
    mark("suspended");
    fault_point("process:suspended");
    check_interrupted(o.copy);

    // 2. The driver checkpoints what is left of each context, and closes its device files.
    for (auto& m : d.processes) {
      driver_lock(m.pid, driver_lock_timeout_ms);
      done.locked.push_back(m.pid);
      fault_point("process:locked");
      driver_checkpoint(m.pid);
      done.checkpointed.push_back(m.pid);
      m.driver_checkpointed = true;
    }
    mark("driver checkpointed");
    fault_point("process:checkpointed");
    check_interrupted(o.copy);

    // 3. CRIU: the CPU side of the whole tree.
    fs::create_directory(done.staging / criu_dir_name);
    std::vector<std::string> args{"dump", "-t", std::to_string(o.pid), "-D", (done.staging / criu_dir_name).string(),
                                  "--shell-job"};
    if (o.leave_running) args.push_back("--leave-running");
    args.insert(args.end(), o.criu_args.begin(), o.criu_args.end());
    fault_point("process:criu");
    if (const int status = run_criu(criu, args, criu_log); status != 0)
      throw tool_error("criu dump failed (exit " + std::to_string(status) + "):" + criu_log_excerpt(criu_log) +
                       "\n(CRIU's log: " + criu_log.string() + ")");
    if (!o.leave_running) {
      // CRIU ended the processes: there is nothing to bring back, only the parts to keep.
      done.suspended.clear();
      done.locked.clear();
      done.checkpointed.clear();
      done.keep_staging = true;
    }
    d.stopped_seconds = seconds_since(start) - stopped_from;
    mark("criu dumped");
    fault_point("process:criu-dumped");

    // 4. With --leave-running, each process goes on: its context back, then its GPU memory.
    if (o.leave_running) {
      for (auto it = d.processes.rbegin(); it != d.processes.rend(); ++it) {
        driver_restore(it->pid);
        done.checkpointed.pop_back();
        driver_unlock(it->pid);
        done.locked.pop_back();
        resume(it->pid, progress);
        done.suspended.pop_back();
      }
      d.stopped_seconds = seconds_since(start) - stopped_from;
      mark("resumed");
    }

    // 5. The manifest over both parts; the image appears under its name in one step.
    d.criu_files = describe_criu_files(done.staging);
    fs::copy_file(criu_log, done.staging / "criu-dump.log", ec);  // for the curious; not part of the image's checks
    write_process_manifest(done.staging, d);
    fault_point("process:written");
    if (fs::symlink_status(output, ec).type() != fs::file_type::not_found)
      throw image::image_error(output.string() + " appeared while the image was written");
    fs::rename(done.staging, output);
    fs::remove(criu_log, ec);
    fs::remove(criu_log.string() + ".out", ec);
    mark("committed");
  } catch (const std::exception& e) {
    const std::string problems = done.undo();
    const std::string kept = done.keep_staging ? "; the process ended with criu dump, and its parts stay in " +
                                                     done.staging.string()
                                               : "";
    if (const auto* i = dynamic_cast<const interrupted*>(&e)) {
      if (problems.empty() && kept.empty()) throw;
      throw interrupted(std::string(i->what()) + problems + kept, i->signal);
    }
    if (problems.empty() && kept.empty())
      throw tool_error(std::string(e.what()) + "; nothing was written, and the process goes on as before");
    throw tool_error(std::string(e.what()) + problems + kept);
  }
  r.image = output;
  r.seconds = seconds_since(start);
  return r;
}

}  // namespace vmmckpt::ckpt
