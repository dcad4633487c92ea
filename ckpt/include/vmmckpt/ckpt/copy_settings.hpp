// How a running program's memory is copied out and written to an image, and what the copy reports: the same for
// dump and suspend, and for the copy pipeline under both (ckpt/src/copy/).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "vmmckpt/image/image.hpp"

namespace vmmckpt::ckpt {

// One writer per core, up to 16: a tmpfs takes about 2 GB/s per writing thread.
int default_writers();

struct copy_reuse;  // ckpt/src/copy/copy_pipeline.cpp

// The pinned staging unless copy_settings::pinned_bytes says otherwise: pinning costs time before the hold, and
// ordinary memory takes the rest.
constexpr std::uint64_t pinned_staging_default = 1ULL << 30;

struct copy_settings {
  std::size_t chunk_bytes = 32ULL << 20;  // one staging buffer
  // The most host memory that takes the program's bytes while it is held: pinned staging buffers (at least
  // two, up to pinned_bytes), then ordinary memory, in which a writer parks the bytes of a buffer the copies
  // need while the program is held (park_while_held), writing them once it goes on. 0: half the memory the
  // system has available (MemAvailable) when the dump starts.
  std::uint64_t staging_bytes = 0;
  // The most of it that is pinned. 0: pinned_staging_default.
  std::uint64_t pinned_bytes = 0;
  // Off for suspend: its program stays held until the image is written anyway.
  bool park_while_held = true;
  int streams = 2;                  // copy streams
  int writers = default_writers();  // threads writing the image, one data file each
  // Set (to the signal's number) by the caller's SIGINT/SIGTERM handler: the operation stops at its
  // next chunk with `interrupted`, leaving nothing and the program released. Null: never.
  const std::atomic<int>* interrupt = nullptr;
  // An incremental image: the image to compare with (docs/image-format.md, "Chains"). Blocks whose
  // checksum equals the parent's block at the same place are not written; empty: a full image.
  std::filesystem::path parent;
  // What the image records as its parent's path (a hint to readers, docs/image-format.md "Chains"); empty:
  // the parent's absolute path. Relative paths are from the directory that holds the image.
  std::filesystem::path parent_recorded_as;
  // The parent is one process's GPU part of a finished whole-process image (process_image.hpp:
  // is_process_image_part), which keeps its suspend claims: a parent with a claim is otherwise refused, as resume
  // and gc delete such an image.
  bool parent_in_process_image = false;
  // Set (make_copy_reuse) for a series of dumps by one tool: the pinned staging and the checksum kernel
  // made by the first are kept for the next, which then starts at once.
  std::shared_ptr<copy_reuse> reuse;
  // Compute the block checksums on the GPU with the kernel built into the tool: in the snapshot after the
  // release, in the held program's memory for what is copied straight out of it, and with a parent all in
  // the program's memory, so that only changed blocks leave it. The writers hash only spans of several
  // small allocations. Without a usable kernel the CPU computes them all, and the result says why.
  bool gpu_checksums = true;
};

// Where a long operation is, for a progress line. Callbacks come from several threads, one at a time.
struct copy_progress {
  enum class stage {
    holding,   // waiting for the program's GPU work to drain before it is held
    copying,   // the program is held while its bytes leave its memory: bytes_done of bytes_total
    released,  // the program goes on, after held_s seconds held, bytes_done of its bytes copied to host memory
               // while held (dump only: suspend keeps it held)
    writing,   // the image is written: bytes_done of bytes_total
    loading,   // resume: the program loads its image: bytes_done of bytes_total
  };
  stage at = stage::writing;
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_total = 0;
  double held_s = 0;
};
using progress_callback = std::function<void(const copy_progress&)>;

// What a dump or a suspend wrote and where its time went.
struct image_result {
  image::manifest manifest;
  std::filesystem::path image;
  double seconds = 0;       // from connecting to the committed image
  double copy_seconds = 0;  // copying the program's memory: to the snapshot, or out of the GPU
  double hold_ms = 0;       // how long the program was held, as the program measured it
  // Where the time went: seconds from the start at which each step ended ("connected", "context",
  // "reserved", "staged", "kernel", "prepared", "held", "planned", "compared", "issued", "released",
  // "copied", "written", "committed", ...), in order.
  std::vector<std::pair<std::string, double>> phases;
  // Where the threads' time went, in seconds summed over the writing threads: waiting for their
  // chunks to come out of the GPU, hashing them, and in write(); and the copying thread's wait
  // for a free staging buffer (the writers being behind).
  struct thread_times {
    int writers = 0;
    double waiting = 0;
    double hashing = 0;
    double writing = 0;
    double copy_waiting = 0;
  } threads;
  // An incremental image: the stored bytes left out because its parent holds them unchanged.
  std::uint64_t unchanged_bytes = 0;
  // Image format 6: the stored bytes of blocks that hold only zeros, neither written nor counted in data_bytes.
  std::uint64_t zero_bytes = 0;
  // Why the parent asked for was not used, the image being full: the image a series (copy_settings::reuse)
  // wrote last changed since it was written. Empty when it was used, or none was asked for.
  std::string parent_dropped;
  // Where the block checksums were computed: "gpu" (by the kernel built into the tool, in the held
  // program's memory and in the snapshot; the writers only write) or "cpu" (the writers hash), and why
  // not on the GPU.
  std::string checksums = "cpu";
  std::string checksums_why;
  double checksum_seconds = 0;  // the kernel's: from its launch until its results were first needed and there
  // Host memory while the program was held (copy_settings::staging_bytes): the staging it could use, pinned and
  // ordinary; the bytes copied out of the GPU into it before the release; those of them parked in ordinary
  // memory, so that the hold did not wait for their writes; and those written to the image while the copies
  // waited for their buffers (the hold then covered writes, and a staging of staging_needed_bytes would have
  // ended it once the bytes were in host memory).
  std::uint64_t staging_bytes = 0;
  std::uint64_t staged_bytes = 0;
  std::uint64_t parked_bytes = 0;
  std::uint64_t held_write_bytes = 0;
  std::uint64_t staging_needed_bytes() const { return held_write_bytes == 0 ? 0 : staging_bytes + held_write_bytes; }
  double released_s = -1;            // when the program went on, in seconds from the start (-1: it was not released)
  std::uint64_t uncopied_bytes = 0;  // unchanged blocks left on the GPU (checksums on the GPU and a parent)
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  void mark(const std::string& step) {
    phases.emplace_back(step, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
};

// What dumps of one series share (copy_settings::reuse).
std::shared_ptr<copy_reuse> make_copy_reuse();

}  // namespace vmmckpt::ckpt
