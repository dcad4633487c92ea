// cuda-ckpt restore IMAGE -- COMMAND: a new process started with an image's GPU memory. This side checks the
// image and plans where the program's pools go; the shim in the new process places them and loads the bytes
// (the restore engine, restore/src).
#pragma once

#include <filesystem>

#include "vmmckpt/image/image.hpp"
#include "vmmckpt/restore/handoff.hpp"

namespace vmmckpt::restore {

struct new_process_options {
  std::filesystem::path image;
  bool replay = false;      // the allocator starts empty with the image's bytes in place (mode::replay)
  bool verify_data = true;  // read every extent's checksum first; false: the structure only
  int device = -1;          // >= 0: this machine's GPU the program's device becomes (migration)
};

struct new_process_start {
  handoff how;               // for export_to_environment, once the caller has set its progress descriptor
  image::manifest manifest;  // what the image holds, for the caller's warnings (lacking memory, IPC imports)
};

// Refuses a bad image before anything starts (image::image_error), so that the program never sees one, and
// plans the restore: the pools exactly where the image's were, for this process (exec keeps its pid). With
// `device`, sets CUDA_VISIBLE_DEVICES so that the program sees that GPU as the device it had.
new_process_start prepare_new_process(const new_process_options& options);

}  // namespace vmmckpt::restore
