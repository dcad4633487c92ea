// The writers of a copy: staging buffers to the image's data files.
#include "copy/chunk_writers.hpp"

#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>

#include "base/cuda_check.hpp"
#include "vmmckpt/support/fault_point.hpp"

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

// Chunk c, from `buffer` (null: not copied, every block zero or unchanged), as extents of `file`. Returns its
// stored bytes; the bytes left to the parent are added to `unchanged`.
std::uint64_t chunk_writers::write_chunk(std::uint32_t file, std::size_t c, unsigned char* buffer,
                                         std::uint64_t& unchanged) {
  if (buffer != nullptr) fault_point("writing-chunk");  // `writing-chunk=slow:MS`: a slow disk
  image::writer& writer = job_.writer;
  const chunk& ch = job_.chunks[c];
  std::uint64_t chunk_total = 0;
  for (std::size_t s = 0; s < ch.spans.size(); ++s) {
    const span& sp = ch.spans[s];
    writer.begin_extent(file, sp.addr, sp.size, sp.stored);
    const unsigned char* bytes = buffer != nullptr ? pack(buffer, ch, sp) : nullptr;
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

std::optional<chunk_writers::parked_chunk> chunk_writers::copy_to_host(std::size_t c,
                                                                       const unsigned char* buffer) const {
  if (buffer == nullptr) return parked_chunk{c, host_pages(), 0};  // not copied: its blocks are only recorded
  fault_point("parking");
  // Only the runs copied into the buffer are touched: the pages between them are never faulted in.
  host_pages copy(job_.chunks[c].bytes, 0);
  if (copy.data() == nullptr) return std::nullopt;
  auto* to = static_cast<unsigned char*>(copy.data());
  std::uint64_t bytes = 0;
  for (const copy_run& r : job_.handoff.runs->of[c]) {
    std::memcpy(to + r.offset, buffer + r.offset, r.bytes);
    bytes += r.bytes;
  }
  return parked_chunk{c, std::move(copy), bytes};
}

void chunk_writers::write_parked(std::uint32_t file, std::vector<parked_chunk>& parked, std::uint64_t& unchanged) {
  for (parked_chunk& p : parked) {
    throw_if_interrupted(job_.interrupt);
    const std::uint64_t bytes = write_chunk(file, p.c, static_cast<unsigned char*>(p.bytes.data()), unchanged);
    p.bytes = host_pages();
    job_.handoff.parked_written(p.copied);
    written(no_buffer, bytes);
  }
  parked.clear();
}

void chunk_writers::pace::rate::saw(std::uint64_t b, double s) {
  bytes += b;
  seconds += s;
  if (bytes < (1u << 20) || seconds <= 0) return;
  const double now = static_cast<double>(bytes) / seconds;
  per_s = per_s == 0 ? now : (per_s + now) / 2;
  bytes = 0;
  seconds = 0;
}

void chunk_writers::park_or_write(std::uint32_t file, std::size_t c, std::size_t b, std::vector<parked_chunk>& parked,
                                  std::uint64_t& unchanged, pace& pace) {
  unsigned char* buffer = b != no_buffer ? job_.staging.buffers[b] : nullptr;
  // A chunk after a parked one is parked too, or written after it: a data file holds its extents in manifest
  // order.
  const std::uint64_t bytes = buffer != nullptr ? job_.handoff.runs->bytes_of(c) : 0;
  // Once it parks, a writer goes on parking while the budget allows: to stop would write what it parked
  // while the program waits.
  if (job_.handoff.reserve_parking(bytes, !parked.empty(), pace.parking_pays() || !parked.empty())) {
    const auto start = clock::now();
    if (auto p = copy_to_host(c, buffer)) {
      pace.park.saw(bytes, std::chrono::duration<double>(clock::now() - start).count());
      parked.push_back(std::move(*p));
      if (buffer != nullptr) job_.handoff.written_chunk(b, 0);  // its buffer is free again
      return;
    }
    job_.handoff.parking_failed(bytes);
  }
  write_parked(file, parked, unchanged);
  const auto start = clock::now();
  const std::uint64_t stored = write_chunk(file, c, buffer, unchanged);
  pace.write.saw(bytes, std::chrono::duration<double>(clock::now() - start).count());
  written(b, stored);
}

void chunk_writers::written(std::size_t b, std::uint64_t bytes) {
  const std::uint64_t done = job_.handoff.written_chunk(b, bytes);
  if (job_.line.writing_shown.load()) job_.line.report(copy_progress::stage::writing, done);
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
    std::vector<parked_chunk> parked;
    pace pace;
    for (;;) {
      const auto wait_start = clock::now();
      std::size_t c, b;
      const auto taken = job_.handoff.take_chunk(c, b, !parked.empty());
      if (taken == chunk_handoff::took::released) {
        write_parked(file, parked, unchanged);
        continue;
      }
      if (taken == chunk_handoff::took::none) {
        if (!parked.empty()) job_.handoff.wait_for_release();  // the hold never waits for these writes
        if (!job_.handoff.failed_or_stopped()) write_parked(file, parked, unchanged);
        return;
      }
      throw_if_interrupted(job_.interrupt);
      if (b != no_buffer) VMMCKPT_CUDA_TRY(d.cuEventSynchronize(job_.staging.events[b]));
      waiting += std::chrono::duration<double>(clock::now() - wait_start).count();
      park_or_write(file, c, b, parked, unchanged, pace);
    }
  } catch (...) {
    job_.handoff.writer_failed(std::current_exception());
  }
}

}  // namespace vmmckpt::ckpt
