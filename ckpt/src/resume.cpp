// cuda-ckpt resume: a suspended program takes its memory back from its image and goes on.
#include <filesystem>

#include "session.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::ckpt {
namespace {

// One resume request on a connection of its own; `image` empty: the one the suspend wrote.
resume_result resume_from(pid_t pid, const progress_callback& progress, const std::filesystem::path& image,
                          std::filesystem::path* recorded) {
  // The program itself loads the image; the tool only asks and waits (a long while: tens of GiB from a
  // slow disk take minutes).
  session s(pid, session::expect::suspended, "resume", std::chrono::steady_clock::now() + std::chrono::minutes(10));
  if (recorded != nullptr) *recorded = s.hello().image;
  control_client::progress_handler loading;
  if (progress)
    loading = [&](const control::progress_frame& f) {
      progress({copy_progress::stage::loading, f.bytes_done, f.bytes_total, 0});
    };
  const auto r = s.client().resume(loading, image.string());
  return {r.bytes, r.seconds, r.image};
}

bool another_image(const control_error& e) {
  return e.refused && std::string(e.what()).find("holds another image") != std::string::npos;
}

}  // namespace

resume_result resume(pid_t pid, const progress_callback& progress, const std::filesystem::path& image) {
  if (!image.empty()) return resume_from(pid, progress, image, nullptr);
  std::filesystem::path recorded;
  try {
    return resume_from(pid, progress, {}, &recorded);
  } catch (const control_error& e) {
    // A whole-process image is renamed when its dump completes, and may have been restored from anywhere: when
    // the directory the suspend wrote is gone, the image is looked for under its other names, most likely
    // first (the program takes only the image_id its suspend wrote, and says so of another).
    std::error_code ec;
    if (!e.refused || recorded.empty() || std::filesystem::exists(std::filesystem::symlink_status(recorded, ec))) throw;
    const auto candidates = moved_gpu_parts(pid, recorded);
    if (candidates.empty()) throw;
    for (std::size_t k = 0;; ++k) {
      try {
        return resume_from(pid, progress, candidates[k], nullptr);
      } catch (const control_error& again) {
        if (!another_image(again) || k + 1 == candidates.size()) throw;
      }
    }
  }
}

}  // namespace vmmckpt::ckpt
