// The writers of a copy (staging → files): one thread per data file, each taking the next copied chunk,
// whichever it is, and appending its extents to its own file, so that a writer that falls behind holds up no
// other, nor the copies, and the file system takes several files at once (it serializes writes to one file).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <thread>
#include <vector>

#include "copy/copy_checksums.hpp"
#include "copy/copy_handoff.hpp"
#include "copy/copy_plan.hpp"
#include "copy/copy_staging.hpp"
#include "copy/parent_blocks.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/host_pages.hpp"

namespace vmmckpt::ckpt {

class chunk_writers {
 public:
  // What the writers work from: all of it outlives them.
  struct job {
    CUcontext context;  // made current on each writer's thread
    copy_staging& staging;
    const std::vector<chunk>& chunks;
    const parent_blocks* parent;  // an incremental image's: its unchanged blocks are inherited, not written
    const copy_checksums& sums;
    const std::atomic<int>* interrupt;  // checked before each chunk
    image::writer& writer;
    image::manifest& manifest;  // its extents, as written
    chunk_handoff& handoff;
    copy_progress_line& line;
    image_result& result;  // the writers' waits and the unchanged bytes
  };
  // Starts a writer for each of `files` data files.
  chunk_writers(const job& j, std::uint32_t files);
  // Tells the writers the copy is over, and waits for them.
  ~chunk_writers();
  chunk_writers(const chunk_writers&) = delete;
  chunk_writers& operator=(const chunk_writers&) = delete;

  // Waits for every chunk to be written; throws what a writer threw.
  void join();

 private:
  // A chunk parked in ordinary memory while the program is held (copy_handoff.hpp), in its buffer's layout.
  struct parked_chunk {
    std::size_t c;
    host_pages bytes;
    std::uint64_t copied;  // of its runs, in `bytes`
  };
  // How fast this writer's writes and parks ran, in bytes a second (0: not seen yet). Parking copies a chunk
  // twice (into ordinary memory, then to the image); into a tmpfs or the page cache a write runs about as fast
  // as a park, and parking would only slow the dump. So a writer parks only once its writes run slower than
  // half its parks (before it has parked: slower than first_park_below).
  struct pace {
    static constexpr double first_park_below = 1e9;
    // Bytes a second, from samples of at least a MiB (small chunks are added up until they make one).
    struct rate {
      double per_s = 0;
      std::uint64_t bytes = 0;
      double seconds = 0;
      void saw(std::uint64_t b, double s);
    };
    rate write, park;
    bool parking_pays() const {
      return write.per_s > 0 && write.per_s < (park.per_s > 0 ? park.per_s / 2 : first_park_below);
    }
  };
  void write_file(std::uint32_t file);
  // Chunk c's bytes from `buffer` (its staging buffer or its parked copy; null: not copied).
  std::uint64_t write_chunk(std::uint32_t file, std::size_t c, unsigned char* buffer, std::uint64_t& unchanged);
  // Chunk c, taken in staging buffer b (no_buffer: not copied), parked while the program is held when the
  // copies need its buffer and parking pays, else written (after what this writer parked).
  void park_or_write(std::uint32_t file, std::size_t c, std::size_t b, std::vector<parked_chunk>& parked,
                     std::uint64_t& unchanged, pace& pace);
  // Chunk c's runs copied out of `buffer` into ordinary memory (null: not copied, nothing to keep): nullopt when
  // there was no memory for it.
  std::optional<parked_chunk> copy_to_host(std::size_t c, const unsigned char* buffer) const;
  // A chunk of `bytes` is written (from staging buffer b, or no_buffer): b goes back, the progress line moves.
  void written(std::size_t b, std::uint64_t bytes);
  // Writes what this writer parked.
  void write_parked(std::uint32_t file, std::vector<parked_chunk>& parked, std::uint64_t& unchanged);
  job job_;
  std::vector<std::thread> threads_;
};

}  // namespace vmmckpt::ckpt
