// The resume request: a suspended program loads its image itself; the tool only asks and waits.
#include <optional>
#include <filesystem>

#include "channel/session.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::ckpt {

resume_result request_resume(pid_t pid, const std::filesystem::path& image, const progress_callback& progress,
                             const char* verb, std::filesystem::path* recorded, control::resume_request::stage stage,
                             const std::vector<std::int64_t>& ranks, std::optional<deadline> until) {
  // By default a long wait: tens of GiB from a slow disk take minutes.
  session s(pid, session::expect::suspended, verb, until.value_or(deadline::in(restore_resume_deadline)));
  if (recorded != nullptr) *recorded = s.hello().image;
  control_client::progress_handler loading;
  if (progress)
    loading = [&](const control::progress_frame& f) {
      progress({copy_progress::stage::loading, f.bytes_done, f.bytes_total, 0});
    };
  const auto r = s.client().resume(loading, image.string(), stage, ranks);
  return {r.bytes, r.seconds, r.image};
}

}  // namespace vmmckpt::ckpt
