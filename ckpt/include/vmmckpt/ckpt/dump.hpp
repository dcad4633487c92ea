// Writing an image of a running process's GPU memory: dump itself (copy_settings.hpp: what it shares with suspend).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>

#include "vmmckpt/ckpt/copy_settings.hpp"
#include "vmmckpt/ckpt/deadlines.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {

struct dump_options {
  pid_t pid = 0;
  std::filesystem::path output;  // the image directory to create
  copy_settings copy;
  std::chrono::milliseconds hold_deadline{default_dump_hold};
  // Hold the program only while its memory is copied to spare GPU memory, when the device has
  // that much to spare (and a quarter of it stays free); otherwise while it is copied to the host.
  bool gpu_snapshot = true;
  // Write an image marked partial when the program has device memory vmmckpt does not own (managed
  // memory, arrays, ...); otherwise such a dump is refused (partial_refused) and writes nothing.
  bool allow_partial = false;
  // A rank of a job's dump (job.hpp): called once everything is prepared, just before the program is held (the
  // job's cut happens there, once every rank is that far), and once its bytes are safe, just before it is
  // released (every rank is released together). Either may throw to give the dump up.
  std::function<void()> before_hold, before_release;
};

struct dump_result : image_result {
  bool gpu_snapshot = false;  // the program was held only for a copy on the GPU (of all or part of its bytes)
  // The bytes copied on the GPU; of the bytes written, those beyond left it while the program was held (zero
  // blocks, and blocks left to the parent, never left it).
  std::uint64_t snapshot_bytes = 0;
};

// Throws tool_error (ckpt/control_client.hpp) or image::image_error; on any
// failure nothing that looks like an image is left and the program runs on.
dump_result dump(const dump_options& options, const progress_callback& progress = {});

}  // namespace vmmckpt::ckpt
