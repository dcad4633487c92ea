// cuda-ckpt dump: hold the program only until its memory is copied out, then write and commit the image.
#include "vmmckpt/ckpt/dump.hpp"

#include <algorithm>

#include "channel/session.hpp"
#include "copy/copy_pipeline.hpp"
#include "copy/held_memory.hpp"
#include "operations/held_copy.hpp"
#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/support/fault_point.hpp"

namespace vmmckpt::ckpt {
namespace {

// Releases the held program, its hold's length measured by the program. A hold the program already ended
// itself (the deadline passed) leaves a copy that may be inconsistent: nothing may be written from it.
void end_hold(session& s, const dump_options& options, dump_result& result) {
  try {
    result.hold_ms = static_cast<double>(s.client().dump_end().held_us) / 1000.0;
  } catch (const control_error& e) {
    if (e.refused && e.refusal == control::refusal::not_held)
      throw tool_error("the hold deadline passed (" +
                       std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options.hold_deadline).count()) +
                       " s, --deadline) before the program's memory was copied: the program was released, "
                       "and the copy may be inconsistent, so no image is written");
    throw;
  }
}

}  // namespace

dump_result dump(const dump_options& options, const progress_callback& progress) {
  dump_result result;
  session s = connect_to_hold(options.pid, "dump", options.hold_deadline, result);
  result.mark("connected");

  // Everything that can be prepared is prepared before the program is held: the destination (fail
  // early if unwritable), the CUDA context, and pinned staging sized from the live bytes.
  copy_pipeline pipeline(options.copy, s.live_bytes());
  const CUcontext context = s.open_context();
  result.mark("context");
  // The GPU snapshot needs the pools on one device: it lives in this tool's one context. (A device's pool and its VMM
  // window, as an NCCL rank has, are on one device.)
  const auto& pools = s.hello().pools;
  const bool one_device =
      std::all_of(pools.begin(), pools.end(), [&](const auto& p) { return p.device == pools[0].device; });
  pipeline.prepare(options.output, context, options.gpu_snapshot && one_device, result);
  result.mark("prepared");

  hold_steps steps;
  steps.hold = [&](received_fds& fds) {
    // Ctrl-C while the program drains, or while dump_end is answered: the connection closes, and the
    // program is released.
    s.client().while_waiting([&] { pipeline.check_interrupted(); });
    return s.client().dump_begin(hold_budget(s, options.hold_deadline), fds);
  };
  steps.allow_partial = options.allow_partial;
  steps.before_hold = options.before_hold;
  steps.release = [&](held_memory& memory) {
    if (options.before_release) options.before_release();
    end_hold(s, options, result);
    if (progress) progress({copy_progress::stage::released, result.staged_bytes, 0, result.hold_ms / 1000.0});
    fault_point("writing");
    memory.release();
    result.mark("released");
  };
  // The driver's cuCheckpointProcessLock is deliberately not taken as well: a tool that dies
  // holding it leaves the program locked for good (the driver does not release it), and a crashed
  // tool must never hang the program. The shim's gate, which reopens when this connection drops,
  // is the quiesce.
  const copy_outcome copied = copy_held(s, pipeline, steps, progress, result);
  result.gpu_snapshot = copied.used_snapshot;
  result.snapshot_bytes = copied.snapshot_bytes;
  image::manifest& m = result.manifest;
  m.hold_us = static_cast<std::uint64_t>(result.hold_ms * 1000.0);
  m.image_id = pipeline.writer().image_id();
  pipeline.committed(options.output, m, pipeline.writer().commit(m));
  result.mark("committed");
  finish(result, options.output);
  return result;
}

}  // namespace vmmckpt::ckpt
