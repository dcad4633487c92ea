// cuda-ckpt resume: a suspended program takes its memory back from its image, wherever that image is now.
#include "vmmckpt/restore/tool/resume.hpp"

#include <string>

#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::restore {
namespace {

bool another_image(const ckpt::control_error& e) {
  return e.refused && std::string(e.what()).find("holds another image") != std::string::npos;
}

}  // namespace

ckpt::resume_result resume(pid_t pid, const ckpt::progress_callback& progress, const std::filesystem::path& image,
                           std::chrono::milliseconds resume_deadline) {
  using stage = control::resume_request::stage;
  const auto until = ckpt::deadline::in(resume_deadline);  // every attempt below by the one deadline
  if (!image.empty()) return ckpt::request_resume(pid, image, progress, "resume", nullptr, stage::both, {}, until);
  std::filesystem::path recorded;
  try {
    return ckpt::request_resume(pid, {}, progress, "resume", &recorded, stage::both, {}, until);
  } catch (const ckpt::control_error& e) {
    // A whole-process image is renamed when its dump completes, and may have been restored from anywhere: when
    // the directory the suspend wrote is gone, the image is looked for under its other names, most likely
    // first (the program takes only the image_id its suspend wrote, and says so of another).
    std::error_code ec;
    if (!e.refused || recorded.empty() || std::filesystem::exists(std::filesystem::symlink_status(recorded, ec))) throw;
    const auto candidates = ckpt::moved_gpu_parts(pid, recorded);
    if (candidates.empty()) throw;
    for (std::size_t k = 0;; ++k) {
      try {
        return ckpt::request_resume(pid, candidates[k], progress, "resume", nullptr, stage::both, {}, until);
      } catch (const ckpt::control_error& again) {
        if (!another_image(again) || k + 1 == candidates.size()) throw;
      }
    }
  }
}

}  // namespace vmmckpt::restore
