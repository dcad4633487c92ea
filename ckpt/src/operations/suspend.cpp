// cuda-ckpt suspend: save a held program's memory to an image, then have it free that memory and wait.
#include "vmmckpt/ckpt/suspend.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "channel/session.hpp"
#include "copy/copy_pipeline.hpp"
#include "copy/held_memory.hpp"
#include "operations/held_copy.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"

namespace vmmckpt::ckpt {
namespace {

// An image no process will depend on, removed; what to say when that fails.
void remove_image(const std::filesystem::path& image) {
  std::error_code ec;
  std::filesystem::remove_all(image, ec);
}

// The committed image opens with every rule checked (headers, sizes, the manifest's and tables' checksums),
// and with --verify its bytes are read back; otherwise it is removed: no request was sent, nobody can depend
// on it.
void check_committed(const suspend_options& options) {
  try {
    const auto check = image::reader::open(options.output);
    check.verify_manifest();
    if (options.verify) check.verify_data();
  } catch (...) {
    remove_image(options.output);  // no request was sent: nobody can depend on it
    throw;
  }
}

// Asks the program to take the claim of `image` and free its memory. None (nullopt): it took the claim and
// did not answer. When it refused, or did not take the claim, the image is removed and this throws.
std::optional<control::suspend_reply> request_suspend(session& s, const suspend_options& options,
                                                      const std::string& image, const std::string& image_id) {
  // A job's rank that is stopped is not waited for: the job's claim, accepted, settles what it does when it goes on
  // (it suspends itself), and its job's suspend says so at once.
  if (options.job) s.client().give_up_on_stopped_after(std::chrono::steady_clock::now());
  try {
    return s.client().suspend(image, image_id);
  } catch (const control_error& e) {
    if (e.refused) {
      // The program did not take the claim: the image is nobody's.
      remove_image(options.output);
      if (e.refusal == control::refusal::not_held)
        throw tool_error(
            "the hold deadline (" +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options.hold_deadline).count()) +
            " s, --deadline) passed before the image was complete and checked: the program was "
            "released and goes on, not suspended");
      throw;
    }
    // No answer from a job's rank: the job's claim is accepted, and the rank suspends itself when it learns that
    // its tool is gone (docs/job-checkpoint.md); its own claim must not be withdrawn under it.
    if (options.job) return std::nullopt;
    // No answer: whether the program took the request is settled by the claim, not guessed.
    if (suspend_claim::take(image, suspend_claim::cancelled)) {
      remove_image(options.output);
      throw tool_error(std::string(e.what()) +
                       "; the suspend is withdrawn: the program goes on, not suspended, when it continues");
    }
    if (!std::filesystem::exists(std::filesystem::path(image) / suspend_claim::accepted)) throw;
    return std::nullopt;
  }
}

// The program reads its image back on resume, at the path this tool gives it.
void check_sees_output(const suspend_options& options) {
  if (!sees_directory(options.pid, options.output))
    throw tool_error("process " + std::to_string(options.pid) +
                     " runs in a mount namespace of its own (a container) "
                     "that does not see " +
                     std::filesystem::absolute(options.output).parent_path().string() +
                     " as this tool does: it reads its image back from there on resume. Give -o a directory "
                     "mounted into it at the same path");
}

// The claim is in the image from the moment it appears (suspend_claim.hpp): whoever renames it
// first, the program accepting or this tool (or `cuda-ckpt gc`) withdrawing, decides.
void add_claim(copy_pipeline& pipeline, const suspend_options& options) {
  pipeline.writer().add_file(
      suspend_claim::pending,
      suspend_claim::encode({::getpid(), suspend_claim::start_time(::getpid()), options.pid,
                             suspend_claim::start_time(options.pid), pipeline.writer().image_id()}));
}

// The program is held for a suspend; it stays held once every byte is out, until its memory is freed.
hold_steps suspend_hold(session& s, copy_pipeline& pipeline, const suspend_options& options, const std::string& image) {
  hold_steps steps;
  steps.hold = [&s, &pipeline, &options, image](received_fds& fds) {
    s.client().while_waiting([&] { pipeline.check_interrupted(); });  // Ctrl-C while the program drains
    // A job's rank learns with its hold where its image will be: should its tool go away once the job's suspend
    // is decided, it suspends itself on that image.
    std::optional<control::job_suspend> job = options.job;
    if (job) {
      job->image = image;
      job->image_id = pipeline.writer().image_id();
    }
    auto held = s.client().dump_begin(hold_budget(s, options.hold_deadline), fds, /*for_suspend=*/true, job);
    s.client().while_waiting({});  // from the suspend request on, an interrupt must not abandon the answer
    return held;
  };
  steps.allow_partial = options.allow_partial;
  steps.before_hold = options.before_hold;
  steps.release = [](held_memory& memory) {
    // The program stays held: only this tool's mapping of its memory goes.
    memory.release();
    fault_point("writing");
  };
  return steps;
}

// The program gives its memory back only once the image is complete and synced, and opens with
// every rule checked (headers, sizes, the manifest's and tables' checksums). The checksums of the
// bytes were taken from the very buffers written; reading them back (--verify) would read the
// page cache, not the medium, so it is optional.
void commit_checked(copy_pipeline& pipeline, const suspend_options& options, suspend_result& result) {
  image::manifest& m = result.manifest;
  m.image_id = pipeline.writer().image_id();
  pipeline.writer().commit(m);
  result.mark("committed");
  check_committed(options);
  result.mark("verified");
  fault_point("verified");
  // The last moment an interrupt undoes the suspend: no request is out, so nobody depends on the image.
  try {
    pipeline.check_interrupted();
    if (options.before_suspend) options.before_suspend(m);
  } catch (...) {
    remove_image(options.output);
    throw;
  }
}

}  // namespace

suspend_result suspend(const suspend_options& options, const progress_callback& progress) {
  suspend_result result;
  session s = connect_to_hold(options.pid, "suspend", options.hold_deadline, result);
  result.mark("connected");
  check_sees_output(options);
  // Nothing is parked: the program stays held until the image is written and checked anyway.
  copy_settings copy = options.copy;
  copy.park_while_held = false;
  copy_pipeline pipeline(copy, s.live_bytes());
  const CUcontext context = s.open_context();
  result.mark("context");
  // No GPU snapshot: the program stays held until its memory is freed anyway.
  pipeline.prepare(options.output, context, false, result);
  const std::string image = std::filesystem::absolute(options.output).lexically_normal().string();
  add_claim(pipeline, options);
  result.mark("prepared");

  copy_held(s, pipeline, suspend_hold(s, pipeline, options, image), progress, result);
  commit_checked(pipeline, options, result);
  const std::optional<control::suspend_reply> suspended =
      request_suspend(s, options, image, pipeline.writer().image_id());
  if (!suspended) {
    // It took the claim and then did not answer (it was stopped, or its answer was lost): it is
    // suspended, or will be when it continues, with this image. Say so; nothing is undone.
    result.late = true;
    result.mark("suspended");
    finish(result, options.output);
    return result;
  }
  fault_point("suspended");
  result.mark("suspended");
  result.hold_ms = static_cast<double>(suspended->held_us) / 1000.0;
  result.freed_bytes = suspended->freed_bytes;
  for (const auto& d : suspended->devices) result.device_used_after += d.used_bytes_after;
  finish(result, options.output);
  return result;
}

std::filesystem::path suspend_dir_of(uid_t uid) { return "/dev/shm/vmmckpt-" + std::to_string(uid); }

std::filesystem::path default_suspend_dir() {
  std::filesystem::path dir = suspend_dir_of(::geteuid());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw tool_error("cannot create " + dir.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    throw tool_error(dir.string() + " is not a private directory of ours; use -o DIR");
  return dir;
}

}  // namespace vmmckpt::ckpt
