// The copy pipeline of dump and suspend: the program's live bytes through pinned staging (or a GPU snapshot) into the image's data files.
#include "copy_pipeline.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "cuda_check.hpp"
#include "vmmckpt/support/fault_point.hpp"

namespace vmmckpt::ckpt {
namespace {

using clock = std::chrono::steady_clock;

// A piece of an allocation: where its bytes are in the chunk's buffer after the copy.
struct piece {
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t offset;  // in the chunk's buffer
};
// One copy and one extent: a run of a pool's memory holding pieces of one or more allocations and
// the gaps between them. Copying small allocations one by one costs a driver call each (200 000
// of them take most of a second), and writing each as an extent of its own costs as much again; a
// span costs one of each. Its pieces' bytes, packed, are the extent's stored bytes: the gaps are
// copied along but never written to the image. Only small allocations are joined: a span of several
// pieces is not contiguous on the GPU, so its blocks are hashed by the CPU after a copy, even when
// nothing in it changed since the parent.
struct span {
  std::size_t pool;      // index into the manifest's pools
  std::size_t extent;    // index into that pool's extents
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t offset;  // in the chunk's buffer
  std::uint64_t stored;  // its pieces' bytes
  std::size_t first_piece, piece_count;
  bool joinable;  // it holds small allocations only: more may join it
};
// One staging buffer's worth of spans, copied back to back; its extents go to one data file.
struct chunk {
  std::vector<piece> pieces;
  std::vector<span> spans;
  std::uint64_t bytes = 0;  // of the buffer, gaps included
};

// The staging buffer of a chunk that is not copied (every block unchanged since the parent).
constexpr std::size_t no_buffer = ~std::size_t{0};

// A gap up to this size between two pieces is copied with them rather than split into two copies.
constexpr std::uint64_t max_gap = 64 << 10;
// Allocations smaller than this are joined into spans; one this size or larger is a span of its own (per
// chunk), whose blocks the GPU can hash where they lie.
constexpr std::uint64_t join_below = image::write_block_size;

// Cuts every pool's allocations into pieces of at most chunk_bytes and packs them into chunks, in
// manifest order, joining nearby pieces into one span where `readable` says the memory between them
// is mapped. Each span is one extent of the manifest. Writers take chunks in that order, so each
// data file gets its extents in it.
std::vector<chunk> plan_chunks(image::manifest& m, std::uint64_t chunk_bytes, std::uint32_t files,
                               const std::function<bool(std::uint64_t, std::uint64_t)>& readable) {
  std::vector<chunk> chunks(1);
  for (std::size_t p = 0; p < m.pools.size(); ++p) {
    auto& pool = m.pools[p];
    pool.extents.clear();
    bool pool_has_span = false;  // spans never join across pools
    for (const auto& a : pool.allocations) {
      for (std::uint64_t done = 0; done < a.size;) {
        chunk* c = &chunks.back();
        const std::uint64_t addr = a.addr + done;
        // Joined to the chunk's last span when the gap is small, mapped, and the chunk has room.
        if (pool_has_span && !c->spans.empty()) {
          span& last = c->spans.back();
          const std::uint64_t end = last.addr + last.size;
          if (last.joinable && a.size < join_below && addr >= end && addr - end <= max_gap &&
              c->bytes + (addr - end) < chunk_bytes && readable(end, addr - end)) {
            const std::uint64_t n = std::min(a.size - done, chunk_bytes - c->bytes - (addr - end));
            c->pieces.push_back({addr, n, last.offset + (addr - last.addr)});
            last.size = addr + n - last.addr;
            last.stored += n;
            ++last.piece_count;
            pool.extents.back().size = last.size;
            pool.extents.back().stored = last.stored;
            c->bytes = last.offset + last.size;
            done += n;
            continue;
          }
        }
        if (c->bytes == chunk_bytes) {
          chunks.emplace_back();
          c = &chunks.back();
        }
        const std::uint64_t n = std::min(a.size - done, chunk_bytes - c->bytes);
        c->spans.push_back({p, pool.extents.size(), addr, n, c->bytes, n, c->pieces.size(), 1, a.size < join_below});
        c->pieces.push_back({addr, n, c->bytes});
        pool.extents.push_back({addr, n, n, 0, 0, 0, {}});
        pool_has_span = true;
        c->bytes += n;
        done += n;
      }
    }
  }
  if (chunks.back().bytes == 0) chunks.pop_back();
  m.data_files = files;  // a file whose writer takes no chunk stays empty
  return chunks;
}

// Packs a span's pieces together at its start in the buffer: its stored bytes. The pieces lie in
// address order, each at or after where it goes, so moving them front to back overwrites nothing
// still needed.
const unsigned char* pack(unsigned char* buffer, const chunk& c, const span& sp) {
  unsigned char* at = buffer + sp.offset;
  for (std::size_t k = sp.first_piece; k < sp.first_piece + sp.piece_count; ++k) {
    const piece& pc = c.pieces[k];
    if (buffer + pc.offset != at) std::memmove(at, buffer + pc.offset, pc.size);
    at += pc.size;
  }
  return buffer + sp.offset;
}

// Calls f(first, end, unchanged, from, to) for each longest run of blocks [first, end) of an extent of
// `stored` bytes whose checksums (`sums`) all equal those of the parent's extent `old`, block for block, or
// all differ (every block, without `old`); [from, to) is the run's byte range in the extent.
template <typename F>
void for_each_block_run(const std::uint64_t* sums, const image::extent* old, std::uint64_t stored, F&& f) {
  const std::size_t count = image::block_count(stored, image::write_block_size);
  auto same = [&](std::size_t k) { return old != nullptr && sums[k] == old->blocks[k].checksum; };
  for (std::size_t k = 0; k < count;) {
    const bool unchanged = same(k);
    std::size_t end = k + 1;
    while (end < count && same(end) == unchanged) ++end;
    f(k, end, unchanged, k * image::write_block_size, std::min<std::uint64_t>(end * image::write_block_size, stored));
    k = end;
  }
}

// An extent of an incremental image, block by block: a block whose checksum equals the parent's
// block at the same place is left to the parent, the others are written, each run in one write.
// Returns the bytes left out. `given`: the blocks' checksums computed on the GPU, or null (the CPU
// computes them here from `bytes`, which may be null only with `given` set and every block unchanged).
std::uint64_t write_changed_blocks(image::writer& writer, std::uint32_t file, const unsigned char* bytes,
                                   std::uint64_t stored, const image::extent* old, const std::uint64_t* given) {
  std::vector<std::uint64_t> computed;
  if (given == nullptr) computed = block_checksums(bytes, stored);
  const std::uint64_t* sums = given != nullptr ? given : computed.data();
  std::uint64_t unchanged = 0;
  for_each_block_run(sums, old, stored, [&](std::size_t first, std::size_t end, bool same, std::uint64_t from,
                                            std::uint64_t to) {
    if (!same) {
      writer.write_blocks(file, bytes + from, static_cast<std::size_t>(to - from), sums + first, end - first);
      return;
    }
    for (std::size_t k = first; k < end; ++k) {
      const std::uint64_t at = k * image::write_block_size;
      writer.inherit_block(file, static_cast<std::size_t>(std::min(image::write_block_size, stored - at)), sums[k]);
    }
    unchanged += to - from;
  });
  return unchanged;
}

}  // namespace

void copy_pipeline::check_interrupted() const {
  if (settings_.interrupt == nullptr) return;
  if (const int sig = settings_.interrupt->load(std::memory_order_relaxed); sig != 0)
    throw interrupted(std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"),
                      sig);
}

int default_writers() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)); }

// Pinned staging buffers and copy streams, released in every case. The buffers are one block of
// pre-faulted memory registered with the driver (much cheaper to pin than cuMemHostAlloc), or
// cuMemHostAlloc buffers where registering is refused.
struct copy_pipeline::staging {
  host_pages pages;
  bool registered = false;
  std::vector<void*> allocated;
  std::vector<unsigned char*> buffers;
  std::vector<CUevent> events;
  std::vector<CUstream> streams;
  // The checksum kernel's own stream (waiting for the copy streams never waits for it), and the end of
  // the copy into the GPU snapshot, which the kernel's run on the snapshot waits for.
  CUstream checksum_stream = nullptr;
  CUevent snapshot_copied = nullptr;

  // The pages alone (no CUDA call): faulted in while the tool's context is being made.
  void reserve(int count, std::size_t bytes) { pages = host_pages(static_cast<std::size_t>(count) * bytes, 8); }

  // With a current context: pins the reserved pages, or allocates pinned buffers instead.
  void allocate(int count, std::size_t bytes) {
    const driver_api& d = driver();
    if (pages.size() != static_cast<std::size_t>(count) * bytes) reserve(count, bytes);
    if (pages.data() != nullptr && d.cuMemHostRegister_v2(pages.data(), pages.size(), 0) == CUDA_SUCCESS) {
      registered = true;
      for (int i = 0; i < count; ++i) buffers.push_back(static_cast<unsigned char*>(pages.data()) + i * bytes);
    } else {
      pages = host_pages();
      for (int i = 0; i < count; ++i) {
        void* b = nullptr;
        VMMCKPT_CUDA_TRY(d.cuMemHostAlloc(&b, bytes, 0));
        allocated.push_back(b);
        buffers.push_back(static_cast<unsigned char*>(b));
      }
    }
    for (int i = 0; i < count; ++i) {
      CUevent e;
      VMMCKPT_CUDA_TRY(d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC));
      events.push_back(e);
    }
  }
  ~staging() {
    if (!registered && allocated.empty() && events.empty() && streams.empty()) return;  // no driver needed
    const driver_api& d = driver();  // loaded: it made them
    if (checksum_stream != nullptr) streams.push_back(checksum_stream);
    for (CUstream s : streams) d.cuStreamSynchronize(s);
    if (snapshot_copied != nullptr) d.cuEventDestroy_v2(snapshot_copied);
    if (registered) d.cuMemHostUnregister(pages.data());
    for (void* b : allocated) d.cuMemFreeHost(b);
    for (CUevent e : events) d.cuEventDestroy_v2(e);
    for (CUstream s : streams) d.cuStreamDestroy_v2(s);
  }
};

// Device memory in this tool's context holding a copy of the program's live bytes, or of as many of
// them as the device has room for.
struct copy_pipeline::gpu_snapshot {
  CUdeviceptr ptr = 0;
  std::uint64_t bytes = 0;
  // Up to `want` bytes, leaving a quarter of the device free: the program must not run out of
  // memory because a dump borrowed it. Less than `least` is not worth it.
  void try_allocate(std::uint64_t want, std::uint64_t least) {
    const driver_api& d = driver();
    std::size_t free = 0, total = 0;
    if (d.cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS || free <= total / 4) return;
    const std::uint64_t n = std::min<std::uint64_t>(want, (free - total / 4) & ~((2ULL << 20) - 1));
    if (n < least) return;
    if (d.cuMemAlloc_v2(&ptr, n) != CUDA_SUCCESS) {
      ptr = 0;
      return;
    }
    bytes = n;
  }
  void release() {
    if (ptr != 0) {
      const driver_api& d = driver();  // loaded: it allocated ptr
      d.cuCtxSynchronize();            // no copy may still read it
      d.cuMemFree_v2(ptr);
    }
    ptr = 0;
    bytes = 0;
  }
  ~gpu_snapshot() { release(); }
};

// What a series of dumps by one tool (dump --every) makes once: the pinned staging with its streams, and
// the checksum kernel; and the image each dump commits, the next one's parent. (The CUDA context is the
// device's primary one, which the tool keeps.)
struct copy_reuse {
  std::shared_ptr<copy_pipeline::staging> staging;
  int buffers = 0;
  std::size_t chunk_bytes = 0;
  std::shared_ptr<gpu_checksums> kernel;
  std::shared_ptr<const parent_blocks> last_image;
};

std::shared_ptr<copy_reuse> make_copy_reuse() { return std::make_shared<copy_reuse>(); }

copy_pipeline::copy_pipeline(const copy_settings& settings, std::uint64_t live_estimate)
    : settings_(settings), live_estimate_(live_estimate) {
  // Enough buffers to take the whole copy when it fits the staging budget, so the program is
  // held only for the copy out of the GPU, not for the writes.
  const std::uint64_t wanted = (live_estimate + settings.chunk_bytes - 1) / settings.chunk_bytes;
  const std::uint64_t budget = std::max<std::uint64_t>(2, settings.staging_bytes / settings.chunk_bytes);
  buffers_ = static_cast<int>(std::clamp<std::uint64_t>(wanted, 2, budget));
  if (copy_reuse* r = settings_.reuse.get();
      r != nullptr && r->staging && r->buffers == buffers_ && r->chunk_bytes == settings_.chunk_bytes) {
    staging_ = r->staging;  // made by an earlier dump of the series, idle since
    return;
  }
  staging_ = std::make_shared<staging>();
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
        parent_ = r->last_image->chain_full() ? std::make_shared<const parent_blocks>(settings_.parent) : r->last_image;
    } else {
      parent_ = std::make_shared<const parent_blocks>(settings_.parent);
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
    if (gpu_sums_->available() && staging_->checksum_stream == nullptr) {
      VMMCKPT_CUDA_TRY(d.cuStreamCreate(&staging_->checksum_stream, CU_STREAM_NON_BLOCKING));
      VMMCKPT_CUDA_TRY(d.cuEventCreate(&staging_->snapshot_copied, CU_EVENT_DISABLE_TIMING));
    }
    result.mark("kernel");
  }
  // With room on the GPU for a second copy of the live bytes, the program is held only while
  // they are copied there (at device speed, about 2 TB/s), then written out from the copy. With
  // room for part of them, the last chunks go there and the first straight out of the GPU. An
  // incremental dump whose checksums the GPU computes first learns in the hold how few bytes
  // changed: its snapshot, if the staging cannot take them all, is made then, of their size.
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

void copy_pipeline::copy(image::manifest& m, const std::function<bool(std::uint64_t, std::uint64_t)>& readable,
                         const std::function<void()>& release, const progress_callback& progress,
                         image_result& result, bool& used_snapshot, std::uint64_t& snapshot_bytes) {
  const driver_api& d = driver();
  staging& st = *staging_;
  image::writer& writer = *writer_;
  // This thread copies the chunks in order into whichever staging buffer is free, and each writer
  // thread (one data file each) takes the next copied chunk and appends it, so PCIe and storage
  // overlap and the file system takes several files at once (it serializes writes to one file).
  const auto chunks = plan_chunks(m, settings_.chunk_bytes, writer.files(), readable);
  if (parent_) m.parent = parent_->ref(settings_.parent_recorded_as);
  result.mark("planned");
  std::uint64_t total = 0;  // the image's bytes (without the gaps copied along)
  for (const auto& c : chunks)
    for (const span& sp : c.spans) total += sp.stored;

  // Block checksums computed on the GPU: for each chunk and span, the batch that has them and where they
  // start in it (no batch: the writer hashes that span on the CPU). Set before the first chunk is handed to
  // a writer.
  std::unique_ptr<gpu_checksums::batch> direct_sums, snapshot_sums;
  std::vector<std::vector<std::pair<gpu_checksums::batch*, std::uint64_t>>> sums_at(chunks.size());
  for (std::size_t c = 0; c < chunks.size(); ++c) sums_at[c].assign(chunks[c].spans.size(), {nullptr, 0});
  auto sums_of = [&](std::size_t c, std::size_t s) -> const std::uint64_t* {  // waits for the kernel
    const auto [batch, at] = sums_at[c][s];
    if (batch == nullptr) return nullptr;
    const std::uint64_t* sums = batch->wait();
    return sums != nullptr ? sums + at : nullptr;
  };

  std::mutex mutex;
  std::condition_variable changed;
  std::size_t issued = 0;  // chunks [0, issued) are copied or in flight
  std::size_t taken = 0;   // chunks [0, taken) are taken by a writer
  std::vector<std::size_t> chunk_buffer(chunks.size());  // the staging buffer each chunk is copied into
  std::vector<std::size_t> free_buffers;
  for (int b = buffers_ - 1; b >= 0; --b) free_buffers.push_back(static_cast<std::size_t>(b));
  bool stop = false;  // the copy is over (done or failed): writers leave
  std::exception_ptr writer_error;
  std::uint64_t written = 0;
  // Progress from this thread and the writers, one at a time. While the program is held the line
  // shows the copy out of its memory; once it goes on, the writing.
  std::mutex progress_mutex;
  std::atomic<bool> writing_shown{false};
  auto report = [&](copy_progress::stage at, std::uint64_t done) {
    if (!progress) return;
    std::lock_guard lock(progress_mutex);
    progress({at, done, total, 0});
  };

  auto write_file = [&](std::uint32_t file) {
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
    } add_waiting{waiting, unchanged, mutex, result};
    try {
      VMMCKPT_CUDA_TRY(d.cuCtxSetCurrent(context_));
      // Each writer takes the next copied chunk, whichever it is, and appends it to its own file: a
      // writer that falls behind holds up no other, nor the copies.
      for (;;) {
        const auto wait_start = clock::now();
        std::size_t c, b;
        {
          std::unique_lock lock(mutex);
          changed.wait(lock, [&] { return taken < issued || taken == chunks.size() || stop || writer_error; });
          if (stop || writer_error || taken == issued) return;
          c = taken++;
          b = chunk_buffer[c];
        }
        check_interrupted();
        const bool copied = b != no_buffer;
        if (copied) VMMCKPT_CUDA_TRY(d.cuEventSynchronize(st.events[b]));
        waiting += std::chrono::duration<double>(clock::now() - wait_start).count();
        std::uint64_t chunk_total = 0;
        for (std::size_t s = 0; s < chunks[c].spans.size(); ++s) {
          const span& sp = chunks[c].spans[s];
          writer.begin_extent(file, sp.addr, sp.size, sp.stored);
          const unsigned char* bytes = copied ? pack(st.buffers[b], chunks[c], sp) : nullptr;  // null: all unchanged
          const image::extent* old = parent_ ? parent_->same_extent(sp.addr, sp.size, sp.stored) : nullptr;
          const std::uint64_t* given = sums_of(c, s);
          if (old != nullptr || given != nullptr)
            unchanged += write_changed_blocks(writer, file, bytes, sp.stored, old, given);
          else
            writer.write(file, bytes, sp.stored);
          m.pools[sp.pool].extents[sp.extent] = writer.end_extent(file);
          chunk_total += sp.stored;
        }
        std::uint64_t done;
        bool wake;  // the copying thread, for a freed buffer; the other writers, to leave after the last chunk
        {
          std::lock_guard lock(mutex);
          if (copied) free_buffers.push_back(b);
          done = written += chunk_total;
          wake = copied || taken == chunks.size();
        }
        if (wake) changed.notify_all();
        if (writing_shown.load()) report(copy_progress::stage::writing, done);
      }
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!writer_error) writer_error = std::current_exception();
      changed.notify_all();
    }
  };
  std::vector<std::thread> writer_threads;
  for (std::uint32_t f = 0; f < m.data_files; ++f) writer_threads.emplace_back(write_file, f);
  struct joiner {
    std::vector<std::thread>& threads;
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    ~joiner() {
      {
        std::lock_guard lock(mu);
        stop = true;
      }
      cv.notify_all();
      for (auto& t : threads)
        if (t.joinable()) t.join();
    }
  } join_writers{writer_threads, mutex, changed, stop};

  // The chunks that fit in the snapshot, counted from the end; those before them are copied out of
  // the GPU while the program is held (all of them when the program grew past the snapshot).
  gpu_snapshot& snapshot = *snapshot_;
  std::size_t first_in_snapshot = chunks.size();
  for (std::uint64_t room = snapshot.bytes; first_in_snapshot > 0 && chunks[first_in_snapshot - 1].bytes <= room;)
    room -= chunks[--first_in_snapshot].bytes;
  if (first_in_snapshot == chunks.size()) snapshot.release();
  // Where a chunk's bytes are in a snapshot made before the hold: the same layout as in a staging buffer.
  std::vector<CUdeviceptr> snapshot_at(chunks.size(), 0);
  for (std::size_t c = first_in_snapshot, at = 0; c < chunks.size(); at += chunks[c++].bytes)
    snapshot_at[c] = snapshot.ptr + at;
  bool released = false;
  const auto copy_start = clock::now();
  report(copy_progress::stage::copying, 0);  // the program is held from here: the copy's rate counts from now
  // Every byte is out of the program's memory (in the snapshot or on the host): let it go on.
  auto release_now = [&] {
    if (direct_sums) direct_sums->wait();  // the kernel reads the program's memory until it is done
    fault_point("releasing");
    check_interrupted();  // the last moment a signal stops the copy: the program is still held
    release();
    released = true;
    std::uint64_t done;
    {
      std::lock_guard lock(mutex);
      done = written;
    }
    writing_shown = true;
    report(copy_progress::stage::writing, done);
  };
  auto release_when_copied = [&] {
    for (CUstream s : st.streams) VMMCKPT_CUDA_TRY(d.cuStreamSynchronize(s));
    report(copy_progress::stage::copying, total);
    result.copy_seconds = std::chrono::duration<double>(clock::now() - copy_start).count();
    used_snapshot = true;
    release_now();
  };
  // The block checksums on the GPU (a span of several pieces, small allocations joined with their gaps, is
  // hashed by its writer, as is everything without a usable kernel):
  // - the chunks copied straight out of the program's memory are hashed in place while it is held, before
  //   their copy, and so are all chunks with a parent: a block the parent holds unchanged then never
  //   leaves the program's memory, and the hold shrinks to the changed blocks;
  // - without a parent, the snapshot's chunks are hashed there once their copy is done, after the release.
  const std::size_t hashed_in_place = parent_ ? chunks.size() : first_in_snapshot;
  const bool gpu_hashing = gpu_sums_ && gpu_sums_->available();
  auto launch = [&](std::size_t from, std::size_t to, bool in_place) {
    std::vector<device_span> spans;
    std::uint64_t blocks = 0;
    std::vector<std::pair<std::size_t, std::size_t>> hashed;  // chunk, span
    for (std::size_t c = from; c < to; ++c)
      for (std::size_t k = 0; k < chunks[c].spans.size(); ++k) {
        const span& sp = chunks[c].spans[k];
        if (sp.piece_count != 1) continue;
        sums_at[c][k].second = blocks;
        hashed.emplace_back(c, k);
        spans.push_back({in_place ? sp.addr : snapshot_at[c] + sp.offset, sp.stored});
        blocks += image::block_count(sp.stored, image::write_block_size);
      }
    auto batch = gpu_sums_->launch(spans, st.checksum_stream);
    for (const auto& [c, k] : hashed) sums_at[c][k].first = batch.get();
    return batch;
  };
  if (gpu_hashing) {
    if (hashed_in_place > 0) direct_sums = launch(0, hashed_in_place, true);
    result.checksums = "gpu";
  } else {
    result.checksums_why = gpu_sums_ ? gpu_sums_->why() : "not asked for (--cpu-checksums)";
  }
  // What of chunk c leaves the program's memory, as runs of one copy each (offset: in the chunk's buffer).
  // Without a parent, or without checksums known before the copy, every span whole; with both, only the
  // runs of blocks whose checksum differs from the parent's, and a block the parent holds unchanged stays
  // on the GPU. Worked out once per chunk, before the first copy (waiting, with a parent, for the kernel).
  struct copy_run {
    CUdeviceptr addr;  // in the program's memory
    std::uint64_t offset, bytes;
    CUdeviceptr in_snapshot = 0;  // where the snapshot holds it, if it does
  };
  std::vector<std::vector<copy_run>> runs_of(chunks.size());
  std::size_t changed_chunks = 0;
  std::uint64_t changed_bytes = 0;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    std::vector<copy_run>& runs = runs_of[c];
    auto add = [&](CUdeviceptr addr, std::uint64_t offset, std::uint64_t bytes) {
      runs.push_back({addr, offset, bytes, snapshot_at[c] != 0 ? snapshot_at[c] + offset : 0});
      changed_bytes += bytes;
    };
    for (std::size_t k = 0; k < chunks[c].spans.size(); ++k) {
      const span& sp = chunks[c].spans[k];
      const std::uint64_t* sums = parent_ ? sums_of(c, k) : nullptr;
      const image::extent* old = sums ? parent_->same_extent(sp.addr, sp.size, sp.stored) : nullptr;
      if (old == nullptr) {
        add(sp.addr, sp.offset, sp.size);
        continue;
      }
      for_each_block_run(sums, old, sp.stored, [&](std::size_t, std::size_t, bool same, std::uint64_t from, std::uint64_t to) {
        if (same)
          result.uncopied_bytes += to - from;
        else
          add(sp.addr + from, sp.offset + from, to - from);
      });
    }
    if (!runs.empty()) ++changed_chunks;
  }
  result.mark("compared");  // what to copy is known: with a parent, once the GPU's checksums are in
  // An incremental dump's snapshot, made now that the changed bytes are known, when they take more staging
  // buffers (one per chunk with a changed block) than there are: their runs packed one after the other, of
  // the chunks that fit counted from the end.
  if (snapshot_later_ && changed_chunks > static_cast<std::size_t>(buffers_)) {
    snapshot.try_allocate(changed_bytes, settings_.chunk_bytes);
    auto bytes_of = [&](std::size_t c) {
      std::uint64_t n = 0;
      for (const copy_run& r : runs_of[c]) n += r.bytes;
      return n;
    };
    for (std::uint64_t room = snapshot.bytes; first_in_snapshot > 0 && bytes_of(first_in_snapshot - 1) <= room;)
      room -= bytes_of(--first_in_snapshot);
    CUdeviceptr at = snapshot.ptr;
    for (std::size_t c = first_in_snapshot; c < chunks.size(); ++c)
      for (copy_run& r : runs_of[c]) {
        r.in_snapshot = at;
        at += r.bytes;
      }
    if (first_in_snapshot == chunks.size()) snapshot.release();
  }
  if (snapshot.ptr != 0) {
    for (std::size_t c = first_in_snapshot; c < chunks.size(); ++c)
      for (const copy_run& r : runs_of[c]) {
        VMMCKPT_CUDA_TRY(d.cuMemcpyDtoDAsync_v2(r.in_snapshot, r.addr, r.bytes, st.streams[0]));
        snapshot_bytes += r.bytes;
      }
    if (gpu_hashing && hashed_in_place < chunks.size()) {
      VMMCKPT_CUDA_TRY(d.cuEventRecord(st.snapshot_copied, st.streams[0]));
      VMMCKPT_CUDA_TRY(d.cuStreamWaitEvent(st.checksum_stream, st.snapshot_copied, 0));
      snapshot_sums = launch(hashed_in_place, chunks.size(), false);
    }
  }
  if (snapshot.ptr != 0 && first_in_snapshot == 0) release_when_copied();
  std::uint64_t issued_bytes = 0;  // of the chunks copied straight out of the program's memory
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (c == first_in_snapshot && c > 0) release_when_copied();
    check_interrupted();
    const std::vector<copy_run>& runs = runs_of[c];
    if (runs.empty()) {
      // Every block unchanged: no staging buffer, no copy; its writer only records the blocks as the parent's.
      // No writer reads chunk_buffer[c] before `issued` passes c. The writers learn of such chunks 64 at a
      // time, or with the next chunk copied, and a writer done with one wakes nobody: a thousand of them
      // otherwise wake every writer a thousand times, mostly to find nothing to take.
      chunk_buffer[c] = no_buffer;
      if ((c + 1) % 64 != 0 && c + 1 != chunks.size()) continue;
      {
        std::lock_guard lock(mutex);
        issued = c + 1;
      }
      changed.notify_all();
      continue;
    }
    std::size_t b;
    {
      const auto wait_start = clock::now();
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return !free_buffers.empty() || writer_error; });
      result.threads.copy_waiting += std::chrono::duration<double>(clock::now() - wait_start).count();
      if (writer_error) break;
      b = free_buffers.back();
      free_buffers.pop_back();
      chunk_buffer[c] = b;
    }
    CUstream s = st.streams[c % st.streams.size()];
    if (snapshot_at[c] != 0 && !parent_) {  // the chunk whole, its gaps too: one copy
      VMMCKPT_CUDA_TRY(d.cuMemcpyDtoHAsync_v2(st.buffers[b], snapshot_at[c], chunks[c].bytes, s));
    } else {
      for (const copy_run& r : runs)
        VMMCKPT_CUDA_TRY(d.cuMemcpyDtoHAsync_v2(st.buffers[b] + r.offset, r.in_snapshot != 0 ? r.in_snapshot : r.addr,
                                                r.bytes, s));
    }
    VMMCKPT_CUDA_TRY(d.cuEventRecord(st.events[b], s));
    {
      std::lock_guard lock(mutex);
      issued = c + 1;
    }
    changed.notify_all();
    if (!released) {
      for (const span& sp : chunks[c].spans) issued_bytes += sp.stored;
      report(copy_progress::stage::copying, issued_bytes);
    }
    fault_point("copying");
  }
  result.mark("issued");  // every copy is queued
  // Every byte is out of the GPU once the copies are done: release the program now, while the
  // last buffers are still being written.
  for (CUstream s : st.streams) VMMCKPT_CUDA_TRY(d.cuStreamSynchronize(s));
  if (!used_snapshot) result.copy_seconds = std::chrono::duration<double>(clock::now() - copy_start).count();
  {
    std::lock_guard lock(mutex);
    if (writer_error) std::rethrow_exception(writer_error);
  }
  result.mark("copied");
  if (!released) {
    report(copy_progress::stage::copying, total);
    release_now();
  }

  for (auto& t : writer_threads) t.join();
  if (writer_error) std::rethrow_exception(writer_error);
  for (auto* batch : {direct_sums.get(), snapshot_sums.get()}) {
    if (batch == nullptr) continue;
    if (batch->wait() == nullptr) {  // its spans were hashed by the writers
      result.checksums = "cpu";
      result.checksums_why = batch->why();
    }
    result.checksum_seconds = std::max(result.checksum_seconds, batch->seconds());
  }
  result.threads.writers = static_cast<int>(m.data_files);
  for (std::uint32_t f = 0; f < m.data_files; ++f) {
    result.threads.hashing += writer.times(f).hashing;
    result.threads.writing += writer.times(f).writing;
  }
  report(copy_progress::stage::writing, total);
  m.data_bytes = total - result.unchanged_bytes;  // what the data files hold
  result.mark("written");
}

}  // namespace vmmckpt::ckpt
