// cuda-ckpt restore DIR: CRIU brings the processes back, the driver their contexts, the shim their GPU memory.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "driver_checkpoint.hpp"
#include "session.hpp"
#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/process_checkpoint.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/hex_text.hpp"
#include "vmmckpt/image.hpp"

namespace vmmckpt::ckpt {
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
                   "checkpointed program still running, dumped with --leave-running?), or restore in a new pid "
                   "namespace");
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
      throw tool_error("another GPU model: the image was taken on " + dev.name + " (GPU " + std::to_string(dev.ordinal) +
                       "), this machine's is " + name + "; the driver restores a context only on the same model");
  }
}

std::string temporary_log(const char* what, pid_t pid) {
  return (fs::temp_directory_path() /
          ("cuda-ckpt-criu-" + std::string(what) + "-" + std::to_string(pid) + "-" + random_hex16() + ".log"))
      .string();
}

}  // namespace

process_restore_result restore_process(const process_restore_options& o, const progress_callback& progress) {
  process_restore_result r;
  const auto start = clock::now();
  auto mark = [&](const char* step) {
    r.phases.emplace_back(step, std::chrono::duration<double>(clock::now() - start).count());
  };
  const fs::path image = fs::absolute(o.image).lexically_normal();
  process_image& d = r.description;
  d = read_process_image(image);
  // The driver's start (cuInit, a tenth of a second) overlaps the reading of the CRIU files.
  auto gpus_checked = std::async(std::launch::async, [&] {
    for (const auto& m : d.processes) require_same_gpus(d.gpu_image(image, m.pid));
  });
  verify_process_image(image, d, o.verify_data);
  mark("verified");
  gpus_checked.get();

  const criu_tool criu = find_criu();
  bool driver_needed = false;
  for (const auto& m : d.processes) driver_needed = driver_needed || m.driver_checkpointed;
  if (driver_needed) {
    if (const std::string missing = driver_checkpoint_missing(); !missing.empty())
      throw tool_error(missing + ": the image's CUDA contexts were checkpointed by the driver, and only it restores them");
  }
  require_free_pid(d.root_pid);
  for (const auto& m : d.processes) require_free_pid(m.pid);
  mark("checked");

  // CRIU writes nothing into the image (it may be read-only, or shared): its log goes to /tmp.
  const std::string log = temporary_log("restore", d.root_pid);
  // CRIU writes its statistics (stats-restore) into its work directory, by default the images': elsewhere,
  // so that the image stays exactly as process.json lists it (and may be read-only).
  const fs::path work = log + ".work";
  fs::create_directory(work);
  std::vector<std::string> args{"restore", "-D", (image / criu_dir_name).string(), "-W", work.string(), "-d", "--shell-job"};
  args.insert(args.end(), o.criu_args.begin(), o.criu_args.end());
  const int status = run_criu(criu, args, log);
  std::error_code ignored;
  fs::remove_all(work, ignored);
  if (status != 0)
    throw tool_error("criu restore failed (exit " + std::to_string(status) + "):" + criu_log_excerpt(log) +
                     "\n(CRIU's log: " + log + "); the image is unchanged");
  mark("criu restored");

  try {
    for (const auto& m : d.processes) {
      if (!m.driver_checkpointed) continue;
      driver_restore(m.pid);
      driver_unlock(m.pid);
    }
    mark("driver restored");
    for (const auto& m : d.processes) {
      session s(m.pid, session::expect::suspended, "restore", clock::now() + std::chrono::minutes(10));
      control_client::progress_handler loading;
      if (progress)
        loading = [&](const control::progress_frame& f) {
          progress({copy_progress::stage::loading, f.bytes_done, f.bytes_total, 0});
        };
      s.client().resume(loading, d.gpu_image(image, m.pid).string());
    }
    mark("resumed");
  } catch (const std::exception& e) {
    // Half restored: a process without its GPU memory must not run on. The image stays as it was.
    for (auto it = d.processes.rbegin(); it != d.processes.rend(); ++it) ::kill(it->pid, SIGKILL);
    ::kill(d.root_pid, SIGKILL);
    throw tool_error(std::string(e.what()) + "; the restored process was ended, and the image is unchanged");
  }
  std::error_code ec;
  fs::remove(log, ec);
  fs::remove(log + ".out", ec);
  r.pid = d.root_pid;
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return r;
}

}  // namespace vmmckpt::ckpt
