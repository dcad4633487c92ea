// The resume request: a suspended program loads its image itself; the tool only asks and waits.
#include <chrono>
#include <filesystem>

#include "channel/session.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::ckpt {

resume_result request_resume(pid_t pid, const std::filesystem::path& image, const progress_callback& progress,
                             const char* verb, std::filesystem::path* recorded, control::resume_request::stage stage,
                             const std::vector<std::int64_t>& ranks,
                             std::optional<std::chrono::steady_clock::time_point> deadline) {
  // By default a long wait: tens of GiB from a slow disk take minutes.
  session s(pid, session::expect::suspended, verb,
            deadline.value_or(std::chrono::steady_clock::now() + std::chrono::minutes(10)));
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
