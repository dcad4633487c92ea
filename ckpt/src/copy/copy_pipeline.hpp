// The copy pipeline of dump and suspend: the program's live bytes through pinned staging (or a GPU snapshot) into the image's data files.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "copy/copy_plan.hpp"
#include "copy/copy_staging.hpp"
#include "copy/gpu_checksums.hpp"
#include "copy/parent_blocks.hpp"
#include "vmmckpt/ckpt/copy_settings.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::ckpt {

// What copy() did, besides the phases and times it marks in the operation's result.
struct copy_outcome {
  bool used_snapshot = false;        // the program was held only for a copy on the GPU (of all or part of its bytes)
  std::uint64_t snapshot_bytes = 0;  // the bytes copied on the GPU (dump_result::snapshot_bytes)
};

// The stages of a copy, each in a file of its own: the plan of what to copy (copy_plan), the GPU's block
// checksums (copy_checksums), the copier (chunk_copier: device to staging), the writers (chunk_writers: staging
// to files), what they share (copy_handoff), and when the program is released (release_policy).
class copy_pipeline {
 public:
  // Starts faulting in pinned staging sized for `live_estimate` bytes (up to the settings' budget, the rest
  // of which is ordinary memory for parked chunks) on a thread of its own, while the caller makes the CUDA
  // context.
  copy_pipeline(const copy_settings& settings, std::uint64_t live_estimate);
  ~copy_pipeline();
  copy_pipeline(const copy_pipeline&) = delete;
  copy_pipeline& operator=(const copy_pipeline&) = delete;

  // Everything that can be made before the program is held, in `context` (current on this thread):
  // the image's data files under a temporary name (an unusable destination fails here), the parent
  // image of an incremental one (opened and checked: a missing or broken parent fails here), the pinned
  // staging, the copy streams, and with `snapshot_allowed` spare GPU memory for a copy of the live bytes.
  // Each step's end goes into result's phases.
  void prepare(const std::filesystem::path& output, CUcontext context, bool snapshot_allowed, image_result& result);

  // Copies every allocation of m's pools (mapped here, each address read at local(addr)) into the image,
  // filling in m's extents, data_files and data_bytes. Nearby allocations are copied together with the gap
  // between them where `readable(addr, size)` says that gap is mapped here. `release` is called once, as soon as every byte has
  // left the program's memory (copied to the snapshot or to the host), while writing goes on.
  // Returns when every byte is written (result's "copied" and "written" phases marked, its copy
  // and thread times filled in), saying whether the GPU snapshot was used. The manifest is not committed.
  copy_outcome copy(image::manifest& m, const readable_fn& readable, const local_fn& local,
                    const std::function<void()>& release, const progress_callback& progress, image_result& result);

  image::writer& writer() { return *writer_; }
  // After the writer committed m (`manifest_checksum`: what commit returned): a series keeps the image as
  // its next dump's parent.
  void committed(const std::filesystem::path& image, const image::manifest& m,
                 std::uint64_t manifest_checksum) noexcept;
  // Throws interrupted when the settings' interrupt flag is set: called between chunks, and by the
  // operations between their steps.
  void check_interrupted() const;

 private:
  // Block by block: the runs of the last chunks that fit packed into the snapshot (made now for an incremental
  // dump). Returns the first of those chunks.
  std::size_t place_runs_in_snapshot(copy_runs& runs, std::size_t chunk_count);

  copy_settings settings_;
  std::uint64_t live_estimate_;
  int buffers_;
  std::uint64_t park_budget_ = 0;          // ordinary host memory for chunks parked while the program is held
  std::shared_ptr<copy_staging> staging_;  // reused by the next dump of a series (copy_settings::reuse)
  std::thread reserving_;
  CUcontext context_ = nullptr;
  std::optional<image::writer> writer_;
  std::unique_ptr<gpu_snapshot> snapshot_;
  bool snapshot_later_ = false;  // made in the hold, of the changed bytes' size (incremental, GPU checksums)
  std::shared_ptr<const parent_blocks> parent_;
  std::shared_ptr<gpu_checksums> gpu_sums_;  // loaded unless the CPU is asked to hash
};

}  // namespace vmmckpt::ckpt
