// cuda-ckpt suspend: save a held program's memory to an image, then have it free that memory and wait.
#include "vmmckpt/ckpt/suspend.hpp"

#include "copy_pipeline.hpp"
#include "held_memory.hpp"
#include "session.hpp"
#include "vmmckpt/fault_point.hpp"

namespace vmmckpt::ckpt {

suspend_result suspend(const suspend_options& options, const progress_callback& progress) {
  suspend_result result;
  session s(options.pid, session::expect::running, "suspend");
  copy_pipeline pipeline(options.copy, s.live_bytes());
  const CUcontext context = s.open_context();
  result.mark("context");
  // No GPU snapshot: the program stays held until its memory is freed anyway.
  pipeline.prepare(options.output, context, false);
  result.mark("prepared");

  received_fds fds;
  const auto held = s.client().dump_begin(options.hold_deadline_ms, fds, options.hold_deadline_ms + 5'000);
  fault_point("held");
  result.mark("held");

  image::manifest& m = result.manifest;
  s.describe_process(m);
  held_memory memory(s, held, fds, m);
  bool snapshot_used = false;
  std::uint64_t snapshot_bytes = 0;
  pipeline.copy(
      m, [&](std::uint64_t addr, std::uint64_t size) { return memory.mapped(addr, size); },
      [&] {
        // The program stays held: only this tool's mapping of its memory goes.
        memory.release();
        fault_point("writing");
      },
      progress, result, snapshot_used, snapshot_bytes);

  // The program gives its memory back only once the image is complete and synced, and opens with
  // every rule checked (headers, sizes, the manifest's checksum). The checksums of the bytes were
  // taken from the very buffers written; reading them back (--verify) would read the page cache,
  // not the medium, so it is optional.
  pipeline.writer().commit(m);
  result.mark("committed");
  const auto check = image::reader::open(options.output);
  check.verify_manifest();
  if (options.verify) check.verify_data();
  result.mark("verified");
  fault_point("verified");
  control::suspend_reply suspended;
  try {
    suspended = s.client().suspend(std::filesystem::absolute(options.output).string(), 120'000);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(options.output, ec);  // the program runs on; the image is no use
    throw;
  }
  fault_point("suspended");
  result.mark("suspended");
  result.hold_ms = static_cast<double>(suspended.held_us) / 1000.0;
  result.freed_bytes = suspended.freed_bytes;
  for (const auto& d : suspended.devices) result.device_used_after += d.used_bytes_after;
  result.image = options.output;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - result.start).count();
  return result;
}

}  // namespace vmmckpt::ckpt
