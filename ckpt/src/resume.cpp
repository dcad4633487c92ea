// cuda-ckpt resume: a suspended program takes its memory back from its image and goes on.
#include "session.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::ckpt {

resume_result resume(pid_t pid, const progress_callback& progress) {
  // The program itself loads the image; the tool only asks and waits (a long while: tens of GiB from a
  // slow disk take minutes).
  session s(pid, session::expect::suspended, "resume", std::chrono::steady_clock::now() + std::chrono::minutes(10));
  control_client::progress_handler loading;
  if (progress)
    loading = [&](const control::progress_frame& f) {
      progress({copy_progress::stage::loading, f.bytes_done, f.bytes_total, 0});
    };
  const auto r = s.client().resume(loading);
  return {r.bytes, r.seconds, r.image};
}

}  // namespace vmmckpt::ckpt
