// The copy pipeline of dump and suspend: the program's live bytes through pinned staging (or a GPU snapshot) into the image's data files.
#include "copy/copy_pipeline.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "copy/chunk_copier.hpp"
#include "copy/chunk_writers.hpp"
#include "copy/copy_checksums.hpp"
#include "copy/copy_handoff.hpp"
#include "copy/copy_plan.hpp"
#include "base/cuda_check.hpp"
#include "copy/release_policy.hpp"
#include "vmmckpt/support/fault_point.hpp"

namespace vmmckpt::ckpt {

void copy_pipeline::check_interrupted() const { throw_if_interrupted(settings_.interrupt); }

// What a series of dumps by one tool (dump --every) makes once: the pinned staging with its streams, and
// the checksum kernel; and the image each dump commits, the next one's parent. (The CUDA context is the
// device's primary one, which the tool keeps.)
struct copy_reuse {
  std::shared_ptr<copy_staging> staging;
  int buffers = 0;
  std::size_t chunk_bytes = 0;
  std::shared_ptr<gpu_checksums> kernel;
  std::shared_ptr<const parent_blocks> last_image;
};

std::shared_ptr<copy_reuse> make_copy_reuse() { return std::make_shared<copy_reuse>(); }

copy_pipeline::copy_pipeline(const copy_settings& settings, std::uint64_t live_estimate)
    : settings_(settings), live_estimate_(live_estimate) {
  // Pinned buffers enough to take the whole copy when it fits (pinning costs time before the hold), then
  // ordinary memory for the chunks writers park while the program is held (copy_handoff.hpp): the program is
  // held only until its bytes are in host memory, not on disk.
  const std::uint64_t chunk = settings.chunk_bytes;
  const std::uint64_t available = available_host_memory();
  const std::uint64_t budget = settings.staging_bytes != 0 ? settings.staging_bytes
                               : available != 0            ? std::max(available / 2, 2 * chunk)
                                                           : pinned_staging_default;
  const std::uint64_t pinned =
      std::min(budget, settings.pinned_bytes != 0 ? settings.pinned_bytes : pinned_staging_default);
  const std::uint64_t wanted = (live_estimate + chunk - 1) / chunk;
  buffers_ = static_cast<int>(std::clamp<std::uint64_t>(wanted, 2, std::max<std::uint64_t>(2, pinned / chunk)));
  const std::uint64_t pinned_bytes = static_cast<std::uint64_t>(buffers_) * chunk;
  park_budget_ = settings.park_while_held && budget > pinned_bytes ? budget - pinned_bytes : 0;
  if (copy_reuse* r = settings_.reuse.get();
      r != nullptr && r->staging && r->buffers == buffers_ && r->chunk_bytes == settings_.chunk_bytes) {
    staging_ = r->staging;  // made by an earlier dump of the series, idle since
    return;
  }
  staging_ = std::make_shared<copy_staging>();
  reserving_ = std::thread([this] { staging_->reserve(buffers_, settings_.chunk_bytes); });
}

copy_pipeline::~copy_pipeline() {
  if (reserving_.joinable()) reserving_.join();
  snapshot_.reset();
  // Before the writer goes, no copy may still be filling a buffer.
  if (copy_reuse* r = settings_.reuse.get(); r != nullptr && !staging_->streams.empty()) {
    const driver_api& d = driver();  // loaded: it made the streams
    bool idle = true;
    for (CUstream s : staging_->streams) idle = d.cuStreamSynchronize(s) == CUDA_SUCCESS && idle;
    if (idle) {
      r->staging = staging_;
      r->buffers = buffers_;
      r->chunk_bytes = settings_.chunk_bytes;
    }
  }
  staging_.reset();
}

void copy_pipeline::prepare(const std::filesystem::path& output, CUcontext context, bool snapshot_allowed,
                            image_result& result) {
  context_ = context;
  if (!settings_.parent.empty()) {
    const copy_reuse* r = settings_.reuse.get();
    if (r != nullptr && r->last_image && r->last_image->is_at(settings_.parent)) {
      // The image this series wrote last: its blocks are taken as written, or not at all. One changed since
      // (edited in place, even to the same size and modification time) is no parent: this image is full.
      result.parent_dropped = r->last_image->changed();
      // A chain at the most a reader follows is opened again, and refused there, saying why.
      if (result.parent_dropped.empty())
        parent_ = r->last_image->chain_full()
                      ? std::make_shared<const parent_blocks>(settings_.parent, settings_.parent_in_process_image)
                      : r->last_image;
    } else {
      parent_ = std::make_shared<const parent_blocks>(settings_.parent, settings_.parent_in_process_image);
    }
  }
  // One data file per writer thread, fewer for a small image.
  const std::uint64_t chunks_estimate =
      std::max<std::uint64_t>(1, (live_estimate_ + settings_.chunk_bytes - 1) / settings_.chunk_bytes);
  const int writers = std::clamp(settings_.writers, 1, int(image::max_data_files));
  writer_.emplace(output, static_cast<std::uint32_t>(std::clamp<std::uint64_t>(chunks_estimate, 1, writers)));

  const driver_api& d = driver();
  if (reserving_.joinable()) {  // not reused: made for this dump
    reserving_.join();
    result.mark("reserved");  // the staging's pages are in (faulted in while the context was made)
    staging_->allocate(buffers_, settings_.chunk_bytes);
  }
  while (staging_->streams.size() < static_cast<std::size_t>(std::max(1, settings_.streams))) {
    CUstream s;
    VMMCKPT_CUDA_TRY(d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    staging_->streams.push_back(s);
  }
  result.mark("staged");
  // Loading the checksum kernel here keeps its cost (loading the module, a self-test) out of the hold.
  if (settings_.gpu_checksums) {
    copy_reuse* r = settings_.reuse.get();
    gpu_sums_ = r != nullptr && r->kernel ? r->kernel : std::make_shared<gpu_checksums>();
    if (r != nullptr) r->kernel = gpu_sums_;
    if (gpu_sums_->available() && staging_->checksum_stream == nullptr)
      VMMCKPT_CUDA_TRY(d.cuStreamCreate(&staging_->checksum_stream, CU_STREAM_NON_BLOCKING));
    result.mark("kernel");
  }
  // With room on the GPU for a second copy of the live bytes, the program is held only while
  // they are copied there (at device speed, about 2 TB/s), then written out from the copy. With
  // room for part of them, the GPU's checksums come first, and the blocks to copy (not zero, or
  // changed since the parent) fill it from the last chunk back; the others leave straight out of the
  // GPU. An incremental dump learns in the hold how few bytes changed: its snapshot, if the staging
  // cannot take them all, is made then, of their size.
  snapshot_ = std::make_unique<gpu_snapshot>();
  snapshot_later_ = snapshot_allowed && parent_ && gpu_sums_ && gpu_sums_->available();
  if (snapshot_allowed && !snapshot_later_)
    snapshot_->try_allocate(live_estimate_ + live_estimate_ / 8 + (64ULL << 20), settings_.chunk_bytes);
}

void copy_pipeline::committed(const std::filesystem::path& image, const image::manifest& m,
                              std::uint64_t manifest_checksum) noexcept {
  copy_reuse* r = settings_.reuse.get();
  if (r == nullptr) return;
  try {
    r->last_image = std::make_shared<const parent_blocks>(image, m, manifest_checksum, parent_.get());
  } catch (...) {
    r->last_image.reset();  // out of memory: the next dump opens its parent from disk
  }
}

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point start) { return std::chrono::duration<double>(clock::now() - start).count(); }

// Lets the held program go on, once: every byte is out of its memory (in the snapshot or on the host).
struct program_release {
  const std::function<void()>& release;
  const copy_checksums& sums;
  const std::atomic<int>* interrupt;
  chunk_handoff& handoff;
  copy_progress_line& line;
  image_result& result;
  bool done = false;

  void now() {
    sums.wait_in_place();  // the kernel reads the program's memory until it is done
    fault_point("releasing");
    throw_if_interrupted(interrupt);  // the last moment a signal stops the copy: the program is still held
    {
      std::lock_guard lock(handoff.mutex);
      result.staged_bytes = handoff.staged;  // what release() reports
    }
    release();
    done = true;
    result.released_s = seconds_since(result.start);
    handoff.release();
    const std::uint64_t written = handoff.written_so_far();
    line.writing_shown = true;
    line.report(copy_progress::stage::writing, written);
  }
};

// A failure on the way leaves copies queued that read the program's memory (mapped here until the caller
// unwinds): they end before it is unmapped.
struct drain_on_failure {
  const copy_staging& st;
  const int exceptions = std::uncaught_exceptions();
  ~drain_on_failure() {
    if (std::uncaught_exceptions() > exceptions) st.drain();
  }
};

// Which chunks go to the snapshot whole, counted from the end (`first` on; chunks.size(): none yet).
struct snapshot_choice {
  bool whole_first = false;  // a full dump's snapshot takes every chunk whole, hashed there after the release
  std::size_t first = 0;
};

// The block checksums and zero flags on the GPU decide what is copied, block by block: a block of zeros, or
// one the parent holds unchanged, never leaves the GPU. A full dump whose snapshot takes every chunk whole
// is held only for the copy into it (at device speed) and hashed there after the release; otherwise every
// chunk is hashed where it lies in the program's memory while it is held, before any copy, and the hold
// shrinks to the other blocks. Without the kernel, whole chunks: those that fit in the snapshot, counted
// from the end, go there; those before them are copied out of the GPU while the program is held.
snapshot_choice choose_snapshot(const std::vector<chunk>& chunks, gpu_snapshot& snapshot, bool by_block,
                                bool incremental) {
  const std::size_t whole_first =
      first_in_snapshot(chunks.size(), snapshot.bytes, [&](std::size_t c) { return chunks[c].bytes; });
  snapshot_choice choice;
  choice.whole_first = by_block && !incremental && snapshot.ptr != 0 && whole_first == 0;
  choice.first = chunks.size();  // by block in place: placed in the snapshot once the runs are known
  if (!by_block || choice.whole_first) {
    choice.first = whole_first;
    if (choice.first == chunks.size()) snapshot.release();
  }
  return choice;
}

// What of each chunk leaves the program's memory (or the snapshot), worked out once, before the first copy
// (waiting for the kernel).
copy_runs block_runs(const std::vector<chunk>& chunks, const std::vector<CUdeviceptr>& snapshot_at,
                     const copy_checksums& sums, const parent_blocks* parent) {
  return plan_copy_runs(chunks, snapshot_at, [&](std::size_t c, std::size_t k) {
    const span& sp = chunks[c].spans[k];
    return span_blocks{sums.of(c, k), sums.zeros_of(c, k),
                       parent != nullptr ? parent->same_extent(sp.addr, sp.size, sp.stored) : nullptr};
  });
}

// The copies out of the held program, from the moment it is held until it is released.
struct held_copies {
  copy_staging& st;
  const std::vector<chunk>& chunks;
  const std::vector<CUdeviceptr>& snapshot_at;
  const std::atomic<int>* interrupt;
  chunk_handoff& handoff;
  copy_progress_line& line;
  image_result& result;
  program_release& released;
  std::uint64_t total;
  const clock::time_point start = clock::now();

  // Every chunk whole into the snapshot, at device speed, then the release. Returns the bytes.
  std::uint64_t whole_into_snapshot(const local_fn& local) {
    copy_runs whole = plan_copy_runs(chunks, snapshot_at, [](std::size_t, std::size_t) { return span_blocks{}; });
    whole.read_at(local);
    chunk_copier into({st, chunks, whole, snapshot_at, false, interrupt, handoff, line, result});
    const std::uint64_t bytes = into.to_snapshot(0);
    into.wait();
    result.copy_seconds = seconds_since(start);
    line.report(copy_progress::stage::copying, total);
    released.now();
    return bytes;
  }

  // The runs out of the GPU: those of the chunks from `first` on into the snapshot (unless it was taken
  // whole already), the others through the staging buffers. The program is released as soon as the
  // release plan allows, at the latest once every copy is done, while the last buffers are still written.
  void runs_out(const copy_runs& runs, bool by_block, std::size_t first, CUdeviceptr snapshot, bool whole_first,
                copy_outcome& out) {
    chunk_copier copier({st, chunks, runs, snapshot_at, by_block, interrupt, handoff, line, result});
    if (snapshot != 0 && !whole_first) out.snapshot_bytes = copier.to_snapshot(first);
    copier.to_staging(released.done ? release_plan{} : plan_release(snapshot != 0, first, chunks.size()), [&] {
      copier.wait();
      line.report(copy_progress::stage::copying, total);
      result.copy_seconds = seconds_since(start);
      out.used_snapshot = out.snapshot_bytes > 0;  // not when the last chunks needed no copy at all
      released.now();
    });
    result.mark("issued");  // every copy is queued
    copier.wait();
    if (!released.done) result.copy_seconds = seconds_since(start);
    handoff.rethrow_writer_error();
    result.mark("copied");
    if (!released.done) {
      line.report(copy_progress::stage::copying, total);
      released.now();
    }
  }
};

// What the writers did and the checksums cost, into the result.
void record_writers(const chunk_handoff& handoff, const copy_checksums& sums, const image::writer& writer,
                    std::uint32_t data_files, image_result& result) {
  result.staged_bytes = handoff.staged;
  result.parked_bytes = handoff.parked;
  result.held_write_bytes = handoff.held_writes;
  sums.summarize(result);
  result.threads.writers = static_cast<int>(data_files);
  for (std::uint32_t f = 0; f < data_files; ++f) {
    result.threads.hashing += writer.times(f).hashing;
    result.threads.writing += writer.times(f).writing;
  }
}

}  // namespace

std::size_t copy_pipeline::place_runs_in_snapshot(copy_runs& runs, std::size_t chunk_count) {
  // An incremental dump makes its snapshot now that the changed bytes are known, when they take more staging
  // buffers (one per chunk with a changed block) than there are.
  gpu_snapshot& snapshot = *snapshot_;
  if (snapshot_later_ && runs.changed_chunks > static_cast<std::size_t>(buffers_))
    snapshot.try_allocate(runs.changed_bytes, settings_.chunk_bytes);
  const std::size_t first =
      first_in_snapshot(chunk_count, snapshot.bytes, [&](std::size_t c) { return runs.bytes_of(c); });
  std::uint64_t placed = 0;
  for (std::size_t c = first; c < chunk_count; ++c) placed += runs.bytes_of(c);
  if (placed == 0) snapshot.release();  // the chunks from `first` on need no copy at all
  runs.place_in_snapshot(first, snapshot.ptr);
  return first;
}

copy_outcome copy_pipeline::copy(image::manifest& m, const readable_fn& readable, const local_fn& local,
                                 const std::function<void()>& release, const progress_callback& progress,
                                 image_result& result) {
  copy_outcome out;
  copy_staging& st = *staging_;
  drain_on_failure drain{st};
  // This thread copies the chunks in order into whichever staging buffer is free (chunk_copier), and each
  // writer thread (one data file each, chunk_writers) takes the next copied chunk and appends it, so PCIe
  // and storage overlap and the file system takes several files at once (it serializes writes to one file).
  const auto chunks = plan_chunks(m, settings_.chunk_bytes, writer_->files(), readable);
  if (parent_) m.parent = parent_->ref(settings_.parent_recorded_as);
  result.mark("planned");
  const std::uint64_t total = stored_bytes(chunks);
  copy_checksums sums(chunks, gpu_sums_.get(), st.checksum_stream);  // set before the first chunk is handed over
  chunk_handoff handoff(chunks.size(), buffers_, park_budget_, settings_.park_while_held);
  result.staging_bytes = static_cast<std::uint64_t>(buffers_) * settings_.chunk_bytes + park_budget_;
  copy_progress_line line(progress, total);
  copy_runs runs;  // worked out below; declared before the writers, which read it until they are joined
  chunk_writers writers(
      {context_, st, chunks, parent_.get(), sums, settings_.interrupt, *writer_, m, handoff, line, result},
      m.data_files);

  gpu_snapshot& snapshot = *snapshot_;
  const bool by_block = sums.on_gpu();
  const snapshot_choice choice = choose_snapshot(chunks, snapshot, by_block, parent_ != nullptr);
  std::size_t first = choice.first;
  const std::vector<CUdeviceptr> snapshot_at = snapshot_places(chunks, first, snapshot.ptr);
  program_release released{release, sums, settings_.interrupt, handoff, line, result};
  held_copies copies{st, chunks, snapshot_at, settings_.interrupt, handoff, line, result, released, total};
  line.report(copy_progress::stage::copying, 0);  // the program is held from here: the copy's rate counts from now
  if (choice.whole_first) {
    out.snapshot_bytes = copies.whole_into_snapshot(local);
    out.used_snapshot = true;
  }
  sums.hash(choice.whole_first ? snapshot_at : std::vector<CUdeviceptr>{}, local, result);
  runs = block_runs(chunks, snapshot_at, sums, parent_.get());
  runs.read_at(local);
  result.uncopied_bytes += runs.uncopied_bytes;
  result.mark("compared");  // what to copy is known
  // Block by block out of the program's memory, the runs to copy packed one after the other in the snapshot,
  // of the chunks that fit counted from the end.
  if (by_block && !choice.whole_first) first = place_runs_in_snapshot(runs, chunks.size());
  handoff.set_runs(runs);
  copies.runs_out(runs, by_block, first, snapshot.ptr, choice.whole_first, out);

  writers.join();
  record_writers(handoff, sums, *writer_, m.data_files, result);
  line.report(copy_progress::stage::writing, total);
  m.data_bytes = image::data_bytes_of(m);  // what the data files hold: not the unchanged blocks, nor the zero ones
  result.zero_bytes = image::zero_bytes_of(m);
  result.mark("written");
  return out;
}

}  // namespace vmmckpt::ckpt
