// When the held program may go on: as soon as every byte has left its memory, to the GPU snapshot or to the
// host. Pure (tests/unit/release_policy_test.cpp); copy_pipeline::copy carries it out.
#pragma once

#include <cstddef>

namespace vmmckpt::ckpt {

struct release_plan {
  static constexpr std::size_t after_copies = ~std::size_t{0};
  // The release comes before chunk `before_chunk` is copied to the host: every chunk from there on is in
  // the snapshot, and the copies into it and those of the chunks before it, straight out of the program's
  // memory, are done by then. after_copies: once every copy out of the program's memory is done, while
  // the last buffers are still being written.
  std::size_t before_chunk = after_copies;
  // The release comes before the last copies: the chunks left are in the snapshot or need no copy.
  bool from_snapshot() const { return before_chunk != after_copies; }
};

// `snapshot_made`: the GPU snapshot holds something; `first_in_snapshot`: the first of the last chunks that
// need nothing of the program's memory once the snapshot is copied (`chunks` when none).
release_plan plan_release(bool snapshot_made, std::size_t first_in_snapshot, std::size_t chunks);

}  // namespace vmmckpt::ckpt
