// The parallel upload: per thread, pread into pinned buffers, hash, copy to the device asynchronously.
#include "vmmckpt/restore/upload.hpp"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/host_pages.hpp"

namespace vmmckpt::restore {
namespace {

// Big enough that a read and a copy cost little next to the bytes they move; two per thread
// so that reading the next piece overlaps copying the last.
constexpr std::size_t piece_bytes = 16ULL << 20;
constexpr std::size_t hash_piece_bytes = 1ULL << 20;
constexpr unsigned max_threads = 16;

status cuda_failed(CUresult r, const char* what) {
  return failure(r, "restore: {} failed (CUDA error {})", what, static_cast<int>(r));
}

#define VMMCKPT_CUDA_STEP(call, what)                                                                         \
  do {                                                                                                        \
    if (const CUresult vmmckpt_r_ = (call); vmmckpt_r_ != CUDA_SUCCESS) return cuda_failed(vmmckpt_r_, what); \
  } while (0)

// One uploading thread's buffers, and its stream and events in each device's context.
class upload_thread {
 public:
  // With `spare` (set aside beforehand, big enough), its memory is used instead of new memory, and kept.
  upload_thread(const driver_api& d, const address_list& keep, host_pages* spare)
      : d_(d),
        keep_(keep),
        own_(usable(spare) ? host_pages() : host_pages(2 * piece_bytes)),
        pages_(usable(spare) ? *spare : own_) {}
  ~upload_thread() {
    for (auto& [device, q] : queues_) {
      d_.cuCtxSetCurrent(q.context);
      d_.cuStreamSynchronize(q.stream);
      for (CUevent e : q.done) d_.cuEventDestroy_v2(e);
      d_.cuStreamDestroy_v2(q.stream);
    }
    if (pinned_) d_.cuMemHostUnregister(pages_.data());
  }
  // It has buffers (a thread that could not get memory for them leaves the work to the others).
  bool ready() const { return pages_.data() != nullptr; }
  upload_thread(const upload_thread&) = delete;
  upload_thread& operator=(const upload_thread&) = delete;

  status upload(const image::reader& reader, const image::pool& pool, const image::extent& e,
                const backed_memory& backed) {
    if (pages_.data() == nullptr)
      return failure(CUDA_ERROR_OUT_OF_MEMORY, "restore: no host memory for the load buffers");
    queue* q = nullptr;
    VMMCKPT_TRY(queue_for(pool.device, q));
    if (!tried_pinning_) {
      // Registering needs a current context (queue_for made one current). Unpinned memory still
      // works, but each copy then blocks and the driver stages it at a few GB/s in all.
      tried_pinning_ = true;
      pinned_ = d_.cuMemHostRegister_v2(pages_.data(), pages_.size(), CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
      if (!pinned_) log::warn("restore: pinning the load buffers failed; loading with blocking copies");
    }
    const std::uint64_t block_bytes = reader.info().block_size;
    image::streaming_checksum sum(block_bytes);
    const auto runs = image::stored_runs(pool, e);
    for (std::size_t i = 0; i < runs.size();) {
      // A big run goes alone, a buffer at a time; its zero blocks are set to zero on the device, never read.
      if (runs[i].size >= piece_bytes) {
        const std::uint64_t end = runs[i].offset + runs[i].size;
        for (std::uint64_t at = 0; at < runs[i].size;) {
          const std::uint64_t from = runs[i].offset + at;
          if (const std::uint64_t zeros = zero_blocks_at(e, block_bytes, from, end, sum); zeros > 0) {
            VMMCKPT_TRY(zero_fill(q, runs[i].addr + at, zeros));
            at += zeros;
            continue;
          }
          const std::uint64_t limit = std::min(end, from + piece_bytes);
          const auto n = static_cast<std::size_t>(next_zero_block(e, block_bytes, from, limit) - from);
          unsigned char* buffer = nullptr;
          VMMCKPT_TRY(take_buffer(q, buffer));
          read_hashed(reader, e, from, n, buffer, sum);
          VMMCKPT_TRY(copy(q, runs[i].addr + at, buffer, n));
          at += n;
        }
        ++i;
        continue;
      }
      // Small runs that fit one buffer as an address range with the gaps between them, each gap
      // mapped: read packed, spread out to their places (gaps zeroed), copied as one.
      const std::uint64_t start = runs[i].addr;
      std::uint64_t end = runs[i].addr + runs[i].size, stored = runs[i].size;
      std::size_t j = i + 1;
      for (; j < runs.size() && runs[j].addr + runs[j].size - start <= piece_bytes && backed &&
             backed(pool.device, end, runs[j].addr - end);
           ++j) {
        end = runs[j].addr + runs[j].size;
        stored += runs[j].size;
      }
      unsigned char* buffer = nullptr;
      VMMCKPT_TRY(take_buffer(q, buffer));
      read_hashed(reader, e, runs[i].offset, stored, buffer, sum);
      // Last first: each run moves up to its place, past where the ones before it still lie.
      for (std::size_t k = j; k-- > i;) {
        const std::uint64_t place = runs[k].addr - start, packed = runs[k].offset - runs[i].offset;
        if (place != packed) std::memmove(buffer + place, buffer + packed, runs[k].size);
        const std::uint64_t gap_end = k + 1 < j ? runs[k + 1].addr - start : place + runs[k].size;
        std::memset(buffer + place + runs[k].size, 0, gap_end - place - runs[k].size);
      }
      VMMCKPT_TRY(copy(q, start, buffer, end - start));
      i = j;
    }
    reader.check_extent(e, sum.value());
    return {};
  }

  // Waits for the last copy from each buffer (earlier ones were waited for before the buffer was
  // reused), and for the zero fills. Events made with CU_EVENT_BLOCKING_SYNC sleep: sixteen uploaders
  // spinning in the driver would take the cores the reads need.
  status finish() {
    for (int b = 0; b < 2; ++b) {
      if (pending_[b] == nullptr) continue;
      d_.cuCtxSetCurrent(pending_[b]->context);
      VMMCKPT_CUDA_STEP(d_.cuEventSynchronize(pending_[b]->done[b]), "finishing the copies to the device");
      pending_[b] = nullptr;
    }
    for (auto& [device, q] : queues_) {
      if (!q.filled) continue;
      d_.cuCtxSetCurrent(q.context);
      VMMCKPT_CUDA_STEP(d_.cuStreamSynchronize(q.stream), "finishing the zero fills on the device");
      q.filled = false;
    }
    return {};
  }

 private:
  struct queue {
    CUcontext context = nullptr;
    CUstream stream = nullptr;
    CUevent done[2] = {nullptr, nullptr};
    bool filled = false;  // a zero fill queued since finish() last waited
  };

  status queue_for(int device, queue*& out) {
    auto it = queues_.find(device);
    if (it == queues_.end()) {
      queue q;
      CUdevice dev;
      VMMCKPT_CUDA_STEP(d_.cuDeviceGet(&dev, device), "finding the device");
      VMMCKPT_CUDA_STEP(d_.cuDevicePrimaryCtxRetain(&q.context, dev), "retaining the device's context");
      VMMCKPT_CUDA_STEP(d_.cuCtxSetCurrent(q.context), "making the device's context current");
      VMMCKPT_CUDA_STEP(d_.cuStreamCreate(&q.stream, CU_STREAM_NON_BLOCKING), "creating a copy stream");
      it = queues_.emplace(device, q).first;  // destroyed with this thread from here on
      for (auto& e : it->second.done)
        VMMCKPT_CUDA_STEP(d_.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC), "creating an event");
    }
    VMMCKPT_CUDA_STEP(d_.cuCtxSetCurrent(it->second.context), "making the device's context current");
    out = &it->second;
    return {};
  }

  // The next of the two buffers, once its previous copy is done.
  status take_buffer(queue* q, unsigned char*& buffer) {
    if (pending_[next_] != nullptr) {
      d_.cuCtxSetCurrent(pending_[next_]->context);
      VMMCKPT_CUDA_STEP(d_.cuEventSynchronize(pending_[next_]->done[next_]), "waiting for a copy to the device");
      pending_[next_] = nullptr;
      d_.cuCtxSetCurrent(q->context);
    }
    buffer = static_cast<unsigned char*>(pages_.data()) + next_ * piece_bytes;
    return {};
  }

  // `size` stored bytes of `e` from `offset`, hashed piece by piece right after each read, while the
  // bytes are still in the cache.
  static void read_hashed(const image::reader& reader, const image::extent& e, std::uint64_t offset, std::size_t size,
                          unsigned char* buffer, image::streaming_checksum& sum) {
    for (std::size_t done = 0; done < size;) {
      const std::size_t m = std::min(size - done, hash_piece_bytes);
      reader.read_part(e, offset + done, m, buffer + done);
      sum.update(buffer + done, m);
      done += m;
    }
  }

  // The stored bytes of e's zero blocks that start at stored offset `from`, one after the other, each wholly
  // before `end`; their checksums go into `sum` in place of their bytes. 0 when no zero block starts there.
  static std::uint64_t zero_blocks_at(const image::extent& e, std::uint64_t block_bytes, std::uint64_t from,
                                      std::uint64_t end, image::streaming_checksum& sum) {
    if (block_bytes == 0 || from % block_bytes != 0 || !sum.at_block_boundary()) return 0;
    std::uint64_t at = from;
    for (std::size_t k = from / block_bytes; k < e.blocks.size() && e.blocks[k].zero; ++k) {
      const std::uint64_t n = std::min(block_bytes, e.stored - at);
      if (at + n > end) break;
      sum.add_block({image::zero_block_checksum(n), false, true});
      at += n;
    }
    return at - from;
  }
  // Where the first zero block after stored offset `from` starts, or `end`.
  static std::uint64_t next_zero_block(const image::extent& e, std::uint64_t block_bytes, std::uint64_t from,
                                       std::uint64_t end) {
    if (block_bytes == 0) return end;
    for (std::size_t k = from / block_bytes + 1; k < e.blocks.size() && k * block_bytes < end; ++k)
      if (e.blocks[k].zero) return k * block_bytes;
    return end;
  }

  // Calls f(at, n) for each part of device memory [addr, addr + size) outside the ranges to keep.
  template <typename F>
  status outside_kept(std::uint64_t addr, std::size_t size, F&& f) const {
    const std::uint64_t end = addr + size;
    auto k = std::lower_bound(keep_.begin(), keep_.end(), addr,
                              [](const auto& r, std::uint64_t at) { return r.first + r.second <= at; });
    for (std::uint64_t at = addr; at < end;) {
      const std::uint64_t stop = k != keep_.end() && k->first < end ? std::max(at, k->first) : end;
      if (stop > at) VMMCKPT_TRY(f(at, stop - at));
      if (stop == end) break;
      at = std::min(end, k->first + k->second);  // past the kept range
      ++k;
    }
    return {};
  }

  // Device memory [addr, addr + size) set to zero, less the ranges to keep: a zero block's bytes.
  status zero_fill(queue* q, std::uint64_t addr, std::uint64_t size) {
    q->filled = true;
    return outside_kept(addr, size, [&](std::uint64_t at, std::uint64_t n) -> status {
      VMMCKPT_CUDA_STEP(d_.cuMemsetD8Async(at, 0, n, q->stream), "setting zero blocks on the device");
      return {};
    });
  }

  // The buffer taken last into device memory at `addr`, less the ranges to keep; the other buffer is next.
  status copy(queue* q, std::uint64_t addr, const unsigned char* buffer, std::size_t size) {
    VMMCKPT_TRY(outside_kept(
        addr, size, [&](std::uint64_t at, std::uint64_t n) { return copy_part(q, at, buffer + (at - addr), n); }));
    if (pinned_) {
      VMMCKPT_CUDA_STEP(d_.cuEventRecord(q->done[next_], q->stream), "recording a copy");
      pending_[next_] = q;
    }
    next_ ^= 1;
    return {};
  }

  status copy_part(queue* q, std::uint64_t addr, const unsigned char* buffer, std::size_t size) {
    if (pinned_)
      VMMCKPT_CUDA_STEP(d_.cuMemcpyHtoDAsync_v2(addr, buffer, size, q->stream), "copying to the device");
    else
      VMMCKPT_CUDA_STEP(d_.cuMemcpyHtoD_v2(addr, buffer, size), "copying to the device");
    return {};
  }

  const driver_api& d_;
  const address_list& keep_;
  static bool usable(const host_pages* spare) {
    return spare != nullptr && spare->data() != nullptr && spare->size() >= 2 * piece_bytes;
  }
  host_pages own_;
  host_pages& pages_;  // own_, or the spare memory set aside for this thread
  bool pinned_ = false, tried_pinning_ = false;
  std::map<int, queue> queues_;
  queue* pending_[2] = {nullptr, nullptr};  // the queue whose copy last read each buffer
  int next_ = 0;
};

}  // namespace

std::size_t load_buffer_bytes() noexcept { return 2 * piece_bytes; }

status upload(const driver_api& d, const image::reader& reader, const backed_memory& backed, bool vmm,
              const upload_progress& progress, const address_list& keep, host_pages* spare) noexcept {
  try {
    const image::manifest& m = reader.info();
    // Work by extent: a thread takes the next one, the data files in turn, so the threads share the
    // work evenly however the bytes fall into files.
    auto order = reader.extents_across_files();
    if (!vmm) std::erase_if(order, [&](const auto& at) { return m.pools[at.first].kind == image::pool_kind::vmm; });
    const unsigned threads = static_cast<unsigned>(std::max<std::size_t>(
        1, std::min<std::size_t>({order.size(), std::thread::hardware_concurrency(), max_threads})));

    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    status first_failure;
    std::uint64_t total = 0, done = 0;                 // stored bytes, under mu
    std::chrono::steady_clock::time_point reported{};  // under mu
    for (const auto& [p, e] : order) total += m.pools[p].extents[e].stored;
    auto loaded = [&](std::uint64_t bytes) noexcept {
      if (!progress) return;
      std::lock_guard lock(mu);
      done += bytes;
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - reported < std::chrono::milliseconds(100)) return;
      reported = now;
      try {
        progress(done, total);
      } catch (...) {
        // Progress is for a person to watch: it never fails the load.
      }
    };
    auto fail_with = [&](status s) {
      std::lock_guard lock(mu);
      if (!failed.exchange(true)) first_failure = std::move(s);
    };
    auto work = [&](host_pages* buffers, bool helper) noexcept {
      // The caller's context stays as it was: this thread's own are set per device.
      CUcontext caller = nullptr;
      d.cuCtxGetCurrent(&caller);
      try {
        upload_thread t(d, keep, buffers);
        // A helper thread without buffers (host memory short: ulimit -v) leaves the work to the others; the
        // calling thread's failure is the upload's.
        if (!t.ready() && helper) {
          d.cuCtxSetCurrent(caller);
          return;
        }
        for (std::size_t k; !failed && (k = next++) < order.size();) {
          const image::pool& p = m.pools[order[k].first];
          const image::extent& e = p.extents[order[k].second];
          if (status s = t.upload(reader, p, e, backed); !s.ok()) {
            fail_with(std::move(s));
            break;
          }
          loaded(e.stored);
        }
        if (status s = t.finish(); !s.ok()) fail_with(std::move(s));
      } catch (const std::exception& e) {
        // The image reader's verdicts (a bad checksum, a short file) and running out of memory.
        fail_with(failure(CUDA_ERROR_INVALID_VALUE, "restore: {}", e.what()));
      }
      d.cuCtxSetCurrent(caller);
    };
    std::vector<std::thread> pool;
    try {
      for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, nullptr, true);
    } catch (...) {
      // Fewer threads than wanted (out of threads or memory): those started do the work.
    }
    work(spare, false);
    for (auto& t : pool) t.join();
    return first_failure;
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "restore: {}", e.what());
  }
}

}  // namespace vmmckpt::restore
