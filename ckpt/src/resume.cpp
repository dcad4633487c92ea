// cuda-ckpt resume: a suspended program takes its memory back from its image and goes on.
#include "session.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::ckpt {

resume_result resume(pid_t pid) {
  session s(pid, session::expect::suspended, "resume");
  // The program itself loads the image; the tool only asks and waits.
  const auto r = s.client().resume(600'000);
  return {r.bytes, r.seconds, r.image};
}

}  // namespace vmmckpt::ckpt
