// The copier of a copy (device → staging): the changed bytes into the GPU snapshot, then each chunk in order
// into whichever staging buffer is free, from the snapshot or straight out of the program's memory, handed to
// the writers as it goes.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "copy/copy_handoff.hpp"
#include "copy/copy_plan.hpp"
#include "copy/copy_staging.hpp"
#include "copy/release_policy.hpp"
#include "vmmckpt/ckpt/copy_settings.hpp"

namespace vmmckpt::ckpt {

class chunk_copier {
 public:
  struct job {
    copy_staging& staging;
    const std::vector<chunk>& chunks;
    const copy_runs& runs;
    const std::vector<CUdeviceptr>& snapshot_at;  // snapshot_places(): whole chunks in the snapshot (or none)
    bool by_block;                      // the GPU hashed the blocks: only the runs are copied, never whole chunks
    const std::atomic<int>* interrupt;  // checked before each chunk
    chunk_handoff& handoff;
    copy_progress_line& line;
    image_result& result;  // the wait for free staging buffers
  };
  explicit chunk_copier(const job& j) : job_(j) {}

  // Queues the copy of the runs of chunks [first, end) into the snapshot, on the first copy stream. Returns
  // the bytes.
  std::uint64_t to_snapshot(std::size_t first);
  // Copies every chunk with something to copy into a free staging buffer, in order, and hands every chunk to
  // the writers; `release` is called where `plan` says (before_chunk), then the copies go on from the
  // snapshot. Returns when every copy is queued, or early when a writer failed.
  void to_staging(const release_plan& plan, const std::function<void()>& release);
  // Waits for every copy queued.
  void wait() const;

 private:
  void copy_chunk(std::size_t c, std::size_t b);
  job job_;
};

}  // namespace vmmckpt::ckpt
