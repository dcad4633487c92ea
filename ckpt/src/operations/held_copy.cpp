// The hold that dump and suspend share.
#include "operations/held_copy.hpp"

#include <chrono>

#include "vmmckpt/ckpt/driver.hpp"
#include "vmmckpt/support/fault_point.hpp"

namespace vmmckpt::ckpt {

session connect_to_hold(pid_t pid, const char* what, std::chrono::milliseconds hold_deadline,
                        const image_result& result) {
  driver();
  return session(pid, session::expect::running, what, deadline(result.start + hold_deadline));
}

copy_outcome copy_held(session& s, copy_pipeline& pipeline, const hold_steps& steps, const progress_callback& progress,
                       image_result& result) {
  pipeline.check_interrupted();
  if (steps.before_hold) steps.before_hold();
  result.mark("cut");
  if (progress) progress({copy_progress::stage::holding});
  received_fds fds;
  auto held = steps.hold(fds);
  // From here the program is held, until dump_end or suspend, or until this connection closes (an exception
  // on the way, an interrupt included, closes it).
  fault_point("held");
  result.mark("held");
  pipeline.check_interrupted();

  image::manifest& m = result.manifest;
  record_memory_not_held(s, held, steps.allow_partial, m);
  s.describe_process(m);
  held_memory memory(s, held, fds, m);
  result.mark("mapped");
  return pipeline.copy(
      m, [&](std::uint64_t addr, std::uint64_t size) { return memory.mapped(addr, size); },
      [&](std::uint64_t addr) { return memory.local(addr); }, [&] { steps.release(memory); }, progress, result);
}

void finish(image_result& result, const std::filesystem::path& image) {
  result.image = image;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - result.start).count();
}

}  // namespace vmmckpt::ckpt
