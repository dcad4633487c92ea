// cuda-ckpt restore DIR: CRIU brings the processes back, the driver their contexts, the shim their GPU memory.
// The image is never changed; a restore that fails ends what CRIU brought back, and one whose tool dies leaves a
// record from which `cuda-ckpt resume` finds the image (process_recovery.hpp).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "vmmckpt/restore/tool/process_restore.hpp"

#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/driver_checkpoint.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/image_owner.hpp"
#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::restore {
using namespace ckpt;  // this file is the restore of what ckpt dumped: its names throughout
namespace fs = std::filesystem;
namespace {

using clock = std::chrono::steady_clock;

// A process that was just killed can stay visible for a moment before it is reaped (up to 2 s seen in
// containers); CRIU restoring its pid meanwhile fails with "File exists".
constexpr auto pid_release_wait = std::chrono::seconds(5);

// Refuses when a pid the image needs is taken by a live process.
void require_free_pid(pid_t pid) {
  const auto until = clock::now() + pid_release_wait;
  while (process_exists(pid) && clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!process_exists(pid)) return;
  const std::string name = short_name_of(pid);
  throw tool_error("pid " + std::to_string(pid) + " is in use" + (name.empty() ? "" : " by '" + name + "'") +
                   ": CRIU gives the restored processes their own pids back. End that process first (is the "
                   "checkpointed program still running, dumped with --leave-running, or stopped by a dump whose tool "
                   "died? `cuda-ckpt ps` says), or restore in a new pid namespace");
}

// The image's GPUs against this machine's: the driver restores a context only on the same model.
void require_same_gpus(const fs::path& gpu_image) {
  const auto reader = image::reader::open(gpu_image);
  const driver_api& d = driver();
  if (d.cuInit(0) != CUDA_SUCCESS) throw tool_error("the CUDA driver finds no GPU here");
  int count = 0;
  d.cuDeviceGetCount(&count);
  for (const auto& dev : reader.info().devices) {
    if (dev.ordinal >= count)
      throw tool_error(gpu_image.string() + " used GPU " + std::to_string(dev.ordinal) + " (" + dev.name +
                       "); this machine has " + std::to_string(count));
    CUdevice here = 0;
    char name[256] = {};
    if (d.cuDeviceGet(&here, dev.ordinal) != CUDA_SUCCESS || d.cuDeviceGetName(name, sizeof name, here) != CUDA_SUCCESS)
      throw tool_error("cannot read the name of GPU " + std::to_string(dev.ordinal) + " here");
    if (!dev.name.empty() && dev.name != name)
      throw tool_error("another GPU model: the image was taken on " + dev.name + " (GPU " +
                       std::to_string(dev.ordinal) + "), this machine's is " + name +
                       "; the driver restores a context only on the same model");
  }
}

std::string temporary_log(const char* what, pid_t pid) {
  return (fs::temp_directory_path() /
          ("cuda-ckpt-criu-" + std::string(what) + "-" + std::to_string(pid) + "-" + random_hex16() + ".log"))
      .string();
}

// The image as named, else under another of its names (an unfinished dump's, completed), as a canonical path:
// what is checked is what CRIU and the processes read, whatever links the name went through.
fs::path image_to_restore(const fs::path& given) {
  const fs::path found = find_process_image(given);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(found, ec))) throw tool_error(given.string() + " does not exist");
  return fs::canonical(found);
}

// As root, only an image nobody but root can have written (docs/security.md).
void require_trusted_owner(const fs::path& image, bool trust_owner) {
  if (::geteuid() != 0 || trust_owner) return;
  if (const std::string why = distrust_of(image); !why.empty())
    throw tool_error("refused: " + why +
                     ". As root, cuda-ckpt restores only an image nobody but root can have "
                     "changed, since the restored processes run what it holds (docs/security.md); check it and pass "
                     "--trust-owner to restore it anyway");
}

// Every process process.json names must be one CRIU restores, the root its root: otherwise the driver and the
// shim would be asked about a process CRIU never brought back, and one it did would be left waiting.
criu_process_tree restored_tree(const fs::path& image, const process_image& d) {
  criu_process_tree tree = read_criu_pstree(image / criu_dir_name);
  if (tree.pids.front() != d.root_pid)
    throw image::image_error((image / process_manifest_name).string() + ": root_pid " + std::to_string(d.root_pid) +
                             ", but CRIU's image restores process " + std::to_string(tree.pids.front()) +
                             " as its root");
  std::vector<pid_t> named = d.driver_only;
  for (const auto& m : d.processes) named.push_back(m.pid);
  for (const pid_t pid : named)
    if (std::find(tree.pids.begin(), tree.pids.end(), pid) == tree.pids.end())
      throw image::image_error((image / process_manifest_name).string() + ": process " + std::to_string(pid) +
                               " is not one CRIU's image restores (" + (image / criu_dir_name / "pstree.img").string() +
                               ")");
  return tree;
}

// The pid CRIU wrote to --pidfile: the root it restored (0 when it wrote none).
pid_t pid_in(const fs::path& pidfile) {
  std::ifstream in(pidfile);
  long pid = 0;
  return (in >> pid) && pid > 0 && pid <= 4'194'304 ? static_cast<pid_t>(pid) : 0;
}

// Ends what CRIU brought back: processes of the image's pids that started after this tool did.
void end_restored(const criu_process_tree& tree, pid_t reported) {
  const std::uint64_t since = suspend_claim::start_time(::getpid());
  std::vector<pid_t> pids = tree.pids;
  if (reported > 0) pids.push_back(reported);
  for (auto it = pids.rbegin(); it != pids.rend(); ++it)
    if (const std::uint64_t started = suspend_claim::start_time(*it); started != 0 && started >= since)
      ::kill(*it, SIGKILL);
}

// The restored processes' contexts back from the driver, then each one's GPU memory from its part.
void bring_back_gpu_state(const fs::path& image, const process_image& d, const progress_callback& progress,
                          const std::function<void(const char*)>& mark) {
  for (const pid_t pid : d.driver_only) {
    driver_restore(pid);
    driver_unlock(pid);
  }
  for (const auto& m : d.processes) {
    if (!m.driver_checkpointed) continue;
    driver_restore(m.pid);
    driver_unlock(m.pid);
  }
  mark("driver restored");
  fault_point("restore:driver-restored");
  if (d.job) {
    // The ranks load their memory together, then each maps the others' again (docs/job-checkpoint.md).
    std::vector<pid_t> ranks;
    for (const auto& m : d.processes) ranks.push_back(m.pid);
    resume_job({0, ranks}, image / gpu_dir_name);
  } else {
    for (const auto& m : d.processes) request_resume(m.pid, d.gpu_image(image, m.pid), progress, "restore");
  }
  mark("resumed");
}

// What the restore needs that is not the image's: the driver's checkpoint API where the image's contexts were
// checkpointed by it, and each pid CRIU restores free.
void require_restorable(const process_image& d, const criu_process_tree& tree) {
  bool driver_needed = !d.driver_only.empty();
  for (const auto& m : d.processes) driver_needed = driver_needed || m.driver_checkpointed;
  if (driver_needed) {
    if (const std::string missing = driver_checkpoint_missing(); !missing.empty())
      throw tool_error(missing +
                       ": the image's CUDA contexts were checkpointed by the driver, and only it restores them");
  }
  for (const pid_t pid : tree.pids) require_free_pid(pid);
}

// The record first: a tool killed from here on leaves processes that `cuda-ckpt resume` finds the image for.
process_transaction write_record(const fs::path& image, const process_image& d, const criu_process_tree& tree) {
  process_transaction record;
  record.op = process_transaction::kind::restore;
  record.root_pid = d.root_pid;
  for (const pid_t pid : tree.pids) record.processes.emplace_back(pid, 0);
  for (const auto& m : d.processes) record.gpu_pids.push_back(m.pid);
  record.image = image;
  settle_transactions(false);  // older records that need nothing more go, so that ps shows only what matters
  record.write();
  return record;
}

// `criu restore` of the image's CPU side, its log into `log`; the root it restored. A failure ends what it
// brought back, removes the record and throws.
pid_t criu_restore(const criu_tool& criu, const fs::path& image, const process_image& d,
                   const process_restore_options& o, const criu_process_tree& tree, process_transaction& record,
                   const std::string& log) {
  // CRIU writes nothing into the image (it may be read-only, or shared): its log goes to /tmp, and its
  // statistics (stats-restore) to a work directory of its own, so that the image stays as process.json lists it.
  const fs::path work = log + ".work", pidfile = log + ".pid";
  fs::create_directory(work);
  std::vector<std::string> args{"restore",     "-D",          (image / criu_dir_name).string(),
                                "-W",          work.string(), "-d",
                                "--shell-job", "--pidfile",   pidfile.string()};
  args.insert(args.end(), o.criu_args.begin(), o.criu_args.end());
  // The connections a job's dump kept (NCCL's bootstrap): restored only with the same flag.
  if (d.job || std::find(args.begin(), args.end(), criu_tcp_established) != args.end()) add_tcp_established(args);
  const int status = run_criu(criu, args, log, [&](pid_t criu_pid) {
    record.note_criu(criu_pid);
    fault_point("restore:criu-running");
  });
  const pid_t root = pid_in(pidfile);
  std::error_code ignored;
  fs::remove_all(work, ignored);
  fs::remove(pidfile, ignored);
  if (status != 0 || root != d.root_pid) {
    end_restored(tree, root);
    record.remove();
    throw tool_error(status != 0 ? "criu restore failed (exit " + std::to_string(status) + "):" +
                                       criu_log_excerpt(log) + "\n(CRIU's log: " + log + "); the image is unchanged"
                                 : "criu restore brought back process " + std::to_string(root) + ", not " +
                                       std::to_string(d.root_pid) + " as the image says: it was ended");
  }
  return root;
}

}  // namespace

process_restore_result restore_process(const process_restore_options& o, const progress_callback& progress) {
  process_restore_result r;
  const auto start = clock::now();
  auto mark = [&](const char* step) {
    r.phases.emplace_back(step, std::chrono::duration<double>(clock::now() - start).count());
  };
  const fs::path image = image_to_restore(o.image);
  require_trusted_owner(image, o.trust_owner);
  process_image& d = r.description;
  d = read_process_image(image);
  // The driver's start (cuInit, a tenth of a second) overlaps the reading of the CRIU files.
  auto gpus_checked = std::async(std::launch::async, [&] {
    for (const auto& m : d.processes) require_same_gpus(d.gpu_image(image, m.pid));
  });
  verify_process_image(image, d, o.verify_data);
  const criu_process_tree tree = restored_tree(image, d);
  mark("verified");
  gpus_checked.get();
  const criu_tool criu = find_criu();
  require_restorable(d, tree);
  mark("checked");

  process_transaction record = write_record(image, d, tree);
  const std::string log = temporary_log("restore", d.root_pid);
  const pid_t root = criu_restore(criu, image, d, o, tree, record, log);
  mark("criu restored");
  fault_point("restore:criu-restored");

  try {
    bring_back_gpu_state(image, d, progress, mark);
  } catch (const std::exception& e) {
    // Half restored: a process without its GPU memory must not run on. The image stays as it was.
    end_restored(tree, root);
    record.remove();
    throw tool_error(std::string(e.what()) + "; the restored process was ended, and the image is unchanged");
  }
  record.remove();
  // Records of dumps and restores of these processes whose tools died are settled now that they run again.
  settle_transactions(false);
  std::error_code ignored;
  fs::remove(log, ignored);
  fs::remove(log + ".out", ignored);
  r.pid = root;
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

void restore_gpu_side(pid_t pid, const std::filesystem::path& gpu_image) {
  recover_driver_state(pid);
  request_resume(pid, gpu_image);
}

}  // namespace vmmckpt::restore
