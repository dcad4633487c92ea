// What the copier and the writers of one copy share: which chunks are copied (or need no copy) and in which
// staging buffer, which buffers are free, the writers' failure, and the progress line.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "copy/copy_plan.hpp"
#include "vmmckpt/ckpt/copy_settings.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {

// Throws interrupted when `interrupt` (copy_settings::interrupt) is set.
inline void throw_if_interrupted(const std::atomic<int>* interrupt) {
  if (interrupt == nullptr) return;
  if (const int sig = interrupt->load(std::memory_order_relaxed); sig != 0)
    throw interrupted(std::string("interrupted by ") + (sig == SIGINT    ? "SIGINT"
                                                        : sig == SIGTERM ? "SIGTERM"
                                                                         : "a signal"),
                      sig);
}

// The copier hands chunks to the writers in order, each in a staging buffer (or in none: every block
// unchanged), and the writers hand the buffers back. One mutex and one condition for all of it.
//
// Parking: while the program is held, once the copier has had to wait for a buffer (the writers are the
// limit), a writer that takes a chunk whose buffer the copies will need (more chunks left to copy than free
// buffers) copies its bytes into ordinary host memory, up to `park_budget` bytes at a time, frees the buffer,
// and writes the bytes once the program is released: the hold ends when the bytes are in host memory, not on
// disk. Beyond the budget the writer writes while the program waits, and `held_writes` counts those bytes.
struct chunk_handoff {
  using clock = std::chrono::steady_clock;
  enum class took { chunk, none, released };

  chunk_handoff(std::size_t chunks, int buffers, std::uint64_t park_budget, bool parking)
      : count(chunks), chunk_buffer(chunks), park_budget(park_budget), parking(parking) {
    for (int b = buffers - 1; b >= 0; --b) free_buffers.push_back(static_cast<std::size_t>(b));
  }

  const std::size_t count;
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t issued = 0;                 // chunks [0, issued) are copied or in flight
  std::size_t taken = 0;                  // chunks [0, taken) are taken by a writer
  std::vector<std::size_t> chunk_buffer;  // the staging buffer each chunk is copied into
  std::vector<std::size_t> free_buffers;
  bool stop = false;  // the copy is over (done or failed): writers leave
  std::exception_ptr writer_error;
  std::uint64_t written = 0;
  // Parking. `runs` says what of each chunk is in its buffer: set (set_runs) before the first chunk is issued.
  const copy_runs* runs = nullptr;
  std::vector<std::size_t> copied_from;  // chunks from c on that take a buffer
  const std::uint64_t park_budget;
  const bool parking;            // dump: the program goes on once its bytes are in host memory
  bool copier_waited = false;    // the copier waited for a buffer while the program was held
  bool released = false;         // the program goes on
  std::uint64_t parked_now = 0;  // bytes parked and not yet written
  // Bytes copied into buffers while the program was held; parked then; written while it waited for buffers.
  std::uint64_t staged = 0, parked = 0, held_writes = 0;

  void set_runs(const copy_runs& r) {
    std::lock_guard lock(mutex);
    runs = &r;
    copied_from.assign(count + 1, 0);
    for (std::size_t c = count; c-- > 0;) copied_from[c] = copied_from[c + 1] + (r.of[c].empty() ? 0 : 1);
  }
  // The copier: a chunk of `bytes` copied into a buffer.
  void staged_chunk(std::uint64_t bytes) {
    std::lock_guard lock(mutex);
    if (!released) staged += bytes;
  }
  // The program goes on: writers with parked chunks write them now.
  void release() {
    {
      std::lock_guard lock(mutex);
      released = true;
    }
    changed.notify_all();
  }
  // A writer with parked chunks and no chunk left to take: until the program goes on (or the copy failed), so
  // that they are written after it.
  void wait_for_release() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return released || stop || writer_error; });
  }
  // A writer, of a chunk of `bytes` it took (0: not copied): whether to park it rather than write it now. One
  // `following` a chunk it parked is parked whenever the budget allows (its extents follow that one's). A writer
  // whose writes run as fast as its parks would (`pays` false) writes: the hold then covers writes by choice,
  // and only those the budget forced are counted.
  bool reserve_parking(std::uint64_t bytes, bool following, bool pays = true) {
    std::lock_guard lock(mutex);
    if (!parking || released || copied_from.empty()) return false;
    if (!following && (bytes == 0 || !copier_waited || copied_from[issued] <= free_buffers.size())) return false;
    if (parked_now + bytes > park_budget) {
      held_writes += bytes;
      return false;
    }
    if (!pays) return false;
    parked_now += bytes;
    parked += bytes;
    return true;
  }
  // A writer could not have the memory to park `bytes` in: it writes them while the program waits.
  void parking_failed(std::uint64_t bytes) {
    std::lock_guard lock(mutex);
    parked_now -= bytes;
    parked -= bytes;
    held_writes += bytes;
  }
  // A writer wrote `bytes` it had parked: while the program was held (the budget ran out), they count as
  // written while it waited.
  void parked_written(std::uint64_t bytes) {
    std::lock_guard lock(mutex);
    parked_now -= bytes;
    if (!released) held_writes += bytes;
  }

  // The copier: a free staging buffer for chunk c, waiting for one (the wait added to `waiting`); false when
  // a writer failed.
  bool take_buffer(std::size_t c, double& waiting, std::size_t& b) {
    const auto wait_start = clock::now();
    std::unique_lock lock(mutex);
    if (free_buffers.empty() && !released) copier_waited = true;
    changed.wait(lock, [&] { return !free_buffers.empty() || writer_error; });
    waiting += std::chrono::duration<double>(clock::now() - wait_start).count();
    if (writer_error) return false;
    b = free_buffers.back();
    free_buffers.pop_back();
    chunk_buffer[c] = b;
    return true;
  }
  // The copier: chunk c needs no copy. No writer reads chunk_buffer[c] before `issued` passes c.
  void uncopied(std::size_t c) { chunk_buffer[c] = no_buffer; }
  // The copier: chunks [0, n) are copied or on their way.
  void issue(std::size_t n) {
    {
      std::lock_guard lock(mutex);
      issued = n;
    }
    changed.notify_all();
  }
  std::uint64_t written_so_far() {
    std::lock_guard lock(mutex);
    return written;
  }
  void rethrow_writer_error() {
    std::lock_guard lock(mutex);
    if (writer_error) std::rethrow_exception(writer_error);
  }
  // The copy is over: the writers leave.
  void finish() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    changed.notify_all();
  }

  // A writer: the next chunk handed over and its buffer; none when there is none left to take, the copy is
  // over or another writer failed; released when the program went on and the writer (`has_parked`) has
  // parked chunks to write first.
  took take_chunk(std::size_t& c, std::size_t& b, bool has_parked) {
    std::unique_lock lock(mutex);
    changed.wait(lock,
                 [&] { return taken < issued || taken == count || stop || writer_error || (has_parked && released); });
    if (stop || writer_error) return took::none;
    if (has_parked && released) return took::released;
    if (taken == issued) return took::none;
    c = taken++;
    b = chunk_buffer[c];
    return took::chunk;
  }
  bool failed_or_stopped() {
    std::lock_guard lock(mutex);
    return stop || writer_error;
  }
  // A writer: chunk in buffer b (or no_buffer) is written, `bytes` of it. Returns the bytes written so far.
  std::uint64_t written_chunk(std::size_t b, std::uint64_t bytes) {
    std::uint64_t done;
    bool wake;  // the copying thread, for a freed buffer; the other writers, to leave after the last chunk
    const bool copied = b != no_buffer;
    {
      std::lock_guard lock(mutex);
      if (copied) free_buffers.push_back(b);
      done = written += bytes;
      wake = copied || taken == count;
    }
    if (wake) changed.notify_all();
    return done;
  }
  void writer_failed(std::exception_ptr e) {
    std::lock_guard lock(mutex);
    if (!writer_error) writer_error = std::move(e);
    changed.notify_all();
  }
};

// The progress line, from the copier and the writers, one at a time. While the program is held it shows the
// copy out of its memory; once it goes on, the writing.
struct copy_progress_line {
  copy_progress_line(const progress_callback& p, std::uint64_t bytes) : progress(p), total(bytes) {}
  const progress_callback& progress;
  const std::uint64_t total;
  std::mutex mutex;
  std::atomic<bool> writing_shown{false};

  void report(copy_progress::stage at, std::uint64_t done) {
    if (!progress) return;
    std::lock_guard lock(mutex);
    progress({at, done, total, 0});
  }
};

}  // namespace vmmckpt::ckpt
