// Writing an image of a running process's GPU memory: what dump and suspend share, and dump itself.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "vmmckpt/image.hpp"

namespace vmmckpt::ckpt {

// One writer per core, up to 16: a tmpfs takes about 2 GB/s per writing thread.
int default_writers();

// How the program's memory is copied out and written: the same for dump and suspend.
struct copy_settings {
  std::size_t chunk_bytes = 32ULL << 20;     // one staging buffer
  std::uint64_t staging_bytes = 1ULL << 30;  // most pinned staging to use (at least two buffers)
  int streams = 2;                           // copy streams
  int writers = default_writers();           // threads writing the image, one data file each
};

struct copy_progress {
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_total = 0;
};
using progress_callback = std::function<void(const copy_progress&)>;

// What a dump or a suspend wrote and where its time went.
struct image_result {
  image::manifest manifest;
  std::filesystem::path image;
  double seconds = 0;       // from connecting to the committed image
  double copy_seconds = 0;  // copying the program's memory: to the snapshot, or out of the GPU
  double hold_ms = 0;       // how long the program was held, as the program measured it
  // Where the time went: seconds from the start at which each step ended ("context", "prepared",
  // "held", "released", "copied", "written", "committed", ...), in order.
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
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  void mark(const std::string& step) {
    phases.emplace_back(step, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
};

struct dump_options {
  pid_t pid = 0;
  std::filesystem::path output;  // the image directory to create
  copy_settings copy;
  int hold_deadline_ms = 60'000;
  // Hold the program only while its memory is copied to spare GPU memory, when the device has
  // that much to spare (and a quarter of it stays free); otherwise while it is copied to the host.
  bool gpu_snapshot = true;
  // Write an image marked partial when the program has device memory vmmckpt does not own (managed
  // memory, arrays, ...); otherwise such a dump is refused (partial_refused) and writes nothing.
  bool allow_partial = false;
};

struct dump_result : image_result {
  bool gpu_snapshot = false;         // the program was held only for a copy on the GPU (of all or part of its bytes)
  std::uint64_t snapshot_bytes = 0;  // the bytes copied on the GPU; the rest left it while the program was held
};

// Throws tool_error (ckpt/control_client.hpp) or image::image_error; on any
// failure nothing that looks like an image is left and the program runs on.
dump_result dump(const dump_options& options, const progress_callback& progress = {});

}  // namespace vmmckpt::ckpt
