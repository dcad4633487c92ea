// The parallel upload: per thread, pread into pinned buffers, hash, copy to the device asynchronously.
#include "vmmckpt/restore/upload.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "vmmckpt/hex_text.hpp"
#include "vmmckpt/host_pages.hpp"

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

#define VMMCKPT_CUDA_STEP(call, what)                                  \
  do {                                                                 \
    if (const CUresult vmmckpt_r_ = (call); vmmckpt_r_ != CUDA_SUCCESS) \
      return cuda_failed(vmmckpt_r_, what);                            \
  } while (0)

// One uploading thread's buffers, and its stream and events in each device's context.
class upload_thread {
 public:
  explicit upload_thread(const driver_api& d) : d_(d), pages_(2 * piece_bytes) {}
  ~upload_thread() {
    for (auto& [device, q] : queues_) {
      d_.cuCtxSetCurrent(q.context);
      d_.cuStreamSynchronize(q.stream);
      for (CUevent e : q.done) d_.cuEventDestroy_v2(e);
      d_.cuStreamDestroy_v2(q.stream);
    }
    if (pinned_) d_.cuMemHostUnregister(pages_.data());
  }
  upload_thread(const upload_thread&) = delete;
  upload_thread& operator=(const upload_thread&) = delete;

  status upload(const image::reader& reader, const image::extent& e, int device) {
    if (pages_.data() == nullptr) return failure(CUDA_ERROR_OUT_OF_MEMORY, "restore: no host memory for the load buffers");
    queue* q = nullptr;
    VMMCKPT_TRY(queue_for(device, q));
    if (!tried_pinning_) {
      // Registering needs a current context (queue_for made one current). Unpinned memory still
      // works, but each copy then blocks and the driver stages it at a few GB/s in all.
      tried_pinning_ = true;
      pinned_ = d_.cuMemHostRegister_v2(pages_.data(), pages_.size(), CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
      if (!pinned_) log::warn("restore: pinning the load buffers failed; loading with blocking copies");
    }
    image::streaming_checksum sum;
    for (std::uint64_t at = 0; at < e.size;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(piece_bytes, e.size - at));
      // The buffer's previous copy must be done before it is filled again.
      if (pending_[next_] != nullptr) {
        d_.cuCtxSetCurrent(pending_[next_]->context);
        VMMCKPT_CUDA_STEP(d_.cuEventSynchronize(pending_[next_]->done[next_]), "waiting for a copy to the device");
        pending_[next_] = nullptr;
        d_.cuCtxSetCurrent(q->context);
      }
      auto* buffer = static_cast<unsigned char*>(pages_.data()) + next_ * piece_bytes;
      // Hashed piece by piece right after each read, while the bytes are still in the cache.
      for (std::size_t done = 0; done < n;) {
        const std::size_t m = std::min(n - done, hash_piece_bytes);
        reader.read_part(e, at + done, m, buffer + done);
        sum.update(buffer + done, m);
        done += m;
      }
      if (pinned_) {
        VMMCKPT_CUDA_STEP(d_.cuMemcpyHtoDAsync_v2(e.addr + at, buffer, n, q->stream), "copying to the device");
        VMMCKPT_CUDA_STEP(d_.cuEventRecord(q->done[next_], q->stream), "recording a copy");
        pending_[next_] = q;
      } else {
        VMMCKPT_CUDA_STEP(d_.cuMemcpyHtoD_v2(e.addr + at, buffer, n), "copying to the device");
      }
      next_ ^= 1;
      at += n;
    }
    reader.check_extent(e, sum.value());
    return {};
  }

  // Waits for the last copy from each buffer (earlier ones were waited for before the buffer was
  // reused). Events made with CU_EVENT_BLOCKING_SYNC sleep: sixteen uploaders spinning in the
  // driver would take the cores the reads need.
  status finish() {
    for (int b = 0; b < 2; ++b) {
      if (pending_[b] == nullptr) continue;
      d_.cuCtxSetCurrent(pending_[b]->context);
      VMMCKPT_CUDA_STEP(d_.cuEventSynchronize(pending_[b]->done[b]), "finishing the copies to the device");
      pending_[b] = nullptr;
    }
    return {};
  }

 private:
  struct queue {
    CUcontext context = nullptr;
    CUstream stream = nullptr;
    CUevent done[2] = {nullptr, nullptr};
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

  const driver_api& d_;
  host_pages pages_;
  bool pinned_ = false, tried_pinning_ = false;
  std::map<int, queue> queues_;
  queue* pending_[2] = {nullptr, nullptr};  // the queue whose copy last read each buffer
  int next_ = 0;
};

}  // namespace

status upload(const driver_api& d, const image::reader& reader) noexcept {
  try {
    const image::manifest& m = reader.info();
    // Work by extent: a thread takes the next one, the data files in turn, so the threads share the
    // work evenly however the bytes fall into files.
    const auto order = reader.extents_across_files();
    const unsigned threads = static_cast<unsigned>(std::max<std::size_t>(
        1, std::min<std::size_t>({order.size(), std::thread::hardware_concurrency(), max_threads})));

    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    status first_failure;
    auto fail_with = [&](status s) {
      std::lock_guard lock(mu);
      if (!failed.exchange(true)) first_failure = std::move(s);
    };
    auto work = [&]() noexcept {
      // The caller's context stays as it was: this thread's own are set per device.
      CUcontext caller = nullptr;
      d.cuCtxGetCurrent(&caller);
      try {
        upload_thread t(d);
        for (std::size_t k; !failed && (k = next++) < order.size();) {
          const image::pool& p = m.pools[order[k].first];
          if (status s = t.upload(reader, p.extents[order[k].second], p.device); !s.ok()) {
            fail_with(std::move(s));
            break;
          }
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
      for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
    } catch (...) {
      // Fewer threads than wanted (out of threads or memory): those started do the work.
    }
    work();
    for (auto& t : pool) t.join();
    return first_failure;
  } catch (const std::exception& e) {
    return failure(CUDA_ERROR_OUT_OF_MEMORY, "restore: {}", e.what());
  }
}

}  // namespace vmmckpt::restore
