// The block checksums and zero flags the GPU computes for one copy: for each chunk and span, the batch that has
// them and where they start in it (no batch: the writer hashes that span on the CPU).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "copy/copy_plan.hpp"
#include "copy/gpu_checksums.hpp"
#include "vmmckpt/ckpt/copy_settings.hpp"

namespace vmmckpt::ckpt {

class copy_checksums {
 public:
  // `kernel`: null when the CPU is asked to hash; `stream`: the kernel's own.
  copy_checksums(const std::vector<chunk>& chunks, gpu_checksums* kernel, CUstream stream);

  // Whether the GPU hashes (a span of several pieces, small allocations joined with their gaps, is hashed by
  // its writer, as is everything without a usable kernel).
  bool on_gpu() const { return kernel_ != nullptr && kernel_->available(); }
  // With the GPU hashing, every chunk hashed, and "gpu" in the result; otherwise why not. Where each chunk
  // lies in the GPU snapshot (snapshot_places()), or, without `snapshot_at`, in the program's memory (read at
  // local(addr)), while it is held and before any copy. Called before the first chunk is handed to a writer.
  void hash(const std::vector<CUdeviceptr>& snapshot_at, const local_fn& local, image_result& result);
  // The checksums of chunk c's span s, waiting for the kernel; null: the writer computes them.
  const std::uint64_t* of(std::size_t c, std::size_t s) const {
    const auto [batch, at] = at_[c][s];
    if (batch == nullptr) return nullptr;
    const std::uint64_t* sums = batch->wait();
    return sums != nullptr ? sums + at : nullptr;
  }
  // Its zero flags (a byte a block), where of() gives checksums.
  const unsigned char* zeros_of(std::size_t c, std::size_t s) const {
    return of(c, s) != nullptr ? at_[c][s].first->zeros() + at_[c][s].second : nullptr;
  }
  // A kernel hashing in place reads the program's memory until it is done: waited for before the release.
  void wait_in_place() const {
    if (batch_ && in_place_) batch_->wait();
  }
  // Once every chunk is written: where the checksums were computed after all, and the kernel's time.
  void summarize(image_result& result) const;

 private:
  const std::vector<chunk>& chunks_;
  gpu_checksums* kernel_;
  CUstream stream_;
  std::unique_ptr<gpu_checksums::batch> batch_;
  bool in_place_ = false;
  std::vector<std::vector<std::pair<gpu_checksums::batch*, std::uint64_t>>> at_;
};

}  // namespace vmmckpt::ckpt
