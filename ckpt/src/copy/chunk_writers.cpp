// The writers of a copy: staging buffers to the image's data files.
#include "copy/chunk_writers.hpp"

#include <chrono>
#include <exception>
#include <mutex>

#include "copy/cuda_check.hpp"

namespace vmmckpt::ckpt {
namespace {

using clock = std::chrono::steady_clock;

// An extent block by block: a block whose checksum equals the parent's block at the same place is left to the
// parent, a block the GPU found all zeros is a zero block, the others are written, each run in one write.
// Returns the bytes left to the parent. `given`: the blocks' checksums computed on the GPU, with its zero flags
// (`zeros`, null exactly when `given` is), or null (the CPU computes them here from `bytes`, which may be null only when no block is written:
// only the blocks to write were copied out of the program's memory).
std::uint64_t write_blocks_by_fate(image::writer& writer, std::uint32_t file, const unsigned char* bytes,
                                   std::uint64_t stored, const image::extent* old, const std::uint64_t* given,
                                   const unsigned char* zeros) {
  std::vector<std::uint64_t> computed;
  if (given == nullptr) computed = block_checksums(bytes, stored);
  const std::uint64_t* sums = given != nullptr ? given : computed.data();
  std::uint64_t unchanged = 0;
  for_each_block_run(
      sums, zeros, old, stored,
      [&](std::size_t first, std::size_t end, block_fate fate, std::uint64_t from, std::uint64_t to) {
        if (fate == block_fate::copy) {
          writer.write_blocks(file, bytes + from, static_cast<std::size_t>(to - from), sums + first, end - first);
          return;
        }
        for (std::size_t k = first; k < end; ++k) {
          const auto size =
              static_cast<std::size_t>(std::min(image::write_block_size, stored - k * image::write_block_size));
          if (fate == block_fate::parent)
            writer.inherit_block(file, size, sums[k]);
          else
            writer.zero_block(file, size);
        }
        if (fate == block_fate::parent) unchanged += to - from;
      });
  return unchanged;
}

}  // namespace

chunk_writers::chunk_writers(const job& j, std::uint32_t files) : job_(j) {
  for (std::uint32_t f = 0; f < files; ++f) threads_.emplace_back(&chunk_writers::write_file, this, f);
}

chunk_writers::~chunk_writers() {
  job_.handoff.finish();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void chunk_writers::join() {
  for (auto& t : threads_) t.join();
  if (job_.handoff.writer_error) std::rethrow_exception(job_.handoff.writer_error);
}

// Chunk c, in staging buffer b (no_buffer: not copied, every block zero or unchanged), as extents of `file`.
// Returns its stored bytes; the bytes left to the parent are added to `unchanged`.
std::uint64_t chunk_writers::write_chunk(std::uint32_t file, std::size_t c, std::size_t b, std::uint64_t& unchanged) {
  image::writer& writer = job_.writer;
  const chunk& ch = job_.chunks[c];
  const bool copied = b != no_buffer;
  std::uint64_t chunk_total = 0;
  for (std::size_t s = 0; s < ch.spans.size(); ++s) {
    const span& sp = ch.spans[s];
    writer.begin_extent(file, sp.addr, sp.size, sp.stored);
    const unsigned char* bytes = copied ? pack(job_.staging.buffers[b], ch, sp) : nullptr;
    const image::extent* old = job_.parent ? job_.parent->same_extent(sp.addr, sp.size, sp.stored) : nullptr;
    const std::uint64_t* given = job_.sums.of(c, s);
    if (old != nullptr || given != nullptr)
      unchanged += write_blocks_by_fate(writer, file, bytes, sp.stored, old, given, job_.sums.zeros_of(c, s));
    else
      writer.write(file, bytes, sp.stored);
    job_.manifest.pools[sp.pool].extents[sp.extent] = writer.end_extent(file);
    chunk_total += sp.stored;
  }
  return chunk_total;
}

void chunk_writers::write_file(std::uint32_t file) {
  double waiting = 0;
  std::uint64_t unchanged = 0;
  struct add_on_exit {  // this thread's waits and unchanged bytes, summed into the result however it leaves
    double& waiting;
    std::uint64_t& unchanged;
    std::mutex& mu;
    image_result& result;
    ~add_on_exit() {
      std::lock_guard lock(mu);
      result.threads.waiting += waiting;
      result.unchanged_bytes += unchanged;
    }
  } add_waiting{waiting, unchanged, job_.handoff.mutex, job_.result};
  try {
    const driver_api& d = driver();
    VMMCKPT_CUDA_TRY(d.cuCtxSetCurrent(job_.context));
    for (;;) {
      const auto wait_start = clock::now();
      std::size_t c, b;
      if (!job_.handoff.take_chunk(c, b)) return;
      throw_if_interrupted(job_.interrupt);
      if (b != no_buffer) VMMCKPT_CUDA_TRY(d.cuEventSynchronize(job_.staging.events[b]));
      waiting += std::chrono::duration<double>(clock::now() - wait_start).count();
      const std::uint64_t done = job_.handoff.written_chunk(b, write_chunk(file, c, b, unchanged));
      if (job_.line.writing_shown.load()) job_.line.report(copy_progress::stage::writing, done);
    }
  } catch (...) {
    job_.handoff.writer_failed(std::current_exception());
  }
}

}  // namespace vmmckpt::ckpt
