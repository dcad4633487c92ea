// cuda-ckpt resume: a suspended program takes its memory back from its image and goes on.
#include "session.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::ckpt {

resume_result resume(pid_t pid) {
  // The program itself loads the image; the tool only asks and waits (a long while: tens of GiB from a
  // slow disk take minutes).
  session s(pid, session::expect::suspended, "resume", std::chrono::steady_clock::now() + std::chrono::minutes(10));
  const auto r = s.client().resume();
  return {r.bytes, r.seconds, r.image};
}

}  // namespace vmmckpt::ckpt
