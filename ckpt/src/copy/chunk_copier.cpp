// The copier of a copy: device to staging.
#include "copy/chunk_copier.hpp"

#include "base/cuda_check.hpp"
#include "vmmckpt/support/fault_point.hpp"

namespace vmmckpt::ckpt {

std::uint64_t chunk_copier::to_snapshot(std::size_t first) {
  const driver_api& d = driver();
  copy_staging& st = job_.staging;
  std::uint64_t bytes = 0;
  for (std::size_t c = first; c < job_.chunks.size(); ++c)
    for (const copy_run& r : job_.runs.of[c]) {
      VMMCKPT_CUDA_TRY(d.cuMemcpyDtoDAsync_v2(r.in_snapshot, r.addr, r.bytes, st.streams[0]));
      bytes += r.bytes;
    }
  return bytes;
}

// Chunk c into staging buffer b: from the snapshot or the program's memory, then the buffer's event.
void chunk_copier::copy_chunk(std::size_t c, std::size_t b) {
  const driver_api& d = driver();
  copy_staging& st = job_.staging;
  CUstream s = st.streams[c % st.streams.size()];
  if (job_.snapshot_at[c] != 0 && !job_.by_block) {  // the chunk whole, its gaps too: one copy
    VMMCKPT_CUDA_TRY(d.cuMemcpyDtoHAsync_v2(st.buffers[b], job_.snapshot_at[c], job_.chunks[c].bytes, s));
  } else {
    for (const copy_run& r : job_.runs.of[c])
      VMMCKPT_CUDA_TRY(
          d.cuMemcpyDtoHAsync_v2(st.buffers[b] + r.offset, r.in_snapshot != 0 ? r.in_snapshot : r.addr, r.bytes, s));
  }
  VMMCKPT_CUDA_TRY(d.cuEventRecord(st.events[b], s));
}

void chunk_copier::to_staging(const release_plan& plan, const std::function<void()>& release) {
  const std::size_t count = job_.chunks.size();
  bool released = false;
  std::uint64_t issued_bytes = 0;  // of the chunks copied straight out of the program's memory
  for (std::size_t c = 0; c < count; ++c) {
    if (c == plan.before_chunk) {
      release();
      released = true;
    }
    throw_if_interrupted(job_.interrupt);
    if (job_.runs.of[c].empty()) {
      // Every block zero or unchanged: no staging buffer, no copy; its writer only records the blocks.
      // The writers learn of such chunks 64 at a time, or with the next chunk copied, and a writer done with
      // one wakes nobody: a thousand of them otherwise wake every writer a thousand times, mostly to find
      // nothing to take.
      job_.handoff.uncopied(c);
      if ((c + 1) % 64 == 0 || c + 1 == count) job_.handoff.issue(c + 1);
      continue;
    }
    std::size_t b;
    if (!job_.handoff.take_buffer(c, job_.result.threads.copy_waiting, b)) break;  // a writer failed
    copy_chunk(c, b);
    job_.handoff.staged_chunk(job_.runs.bytes_of(c));
    job_.handoff.issue(c + 1);
    if (!released) {
      for (const span& sp : job_.chunks[c].spans) issued_bytes += sp.stored;
      job_.line.report(copy_progress::stage::copying, issued_bytes);
    }
    fault_point("copying");
  }
}

void chunk_copier::wait() const {
  const driver_api& d = driver();
  for (CUstream s : job_.staging.streams) VMMCKPT_CUDA_TRY(d.cuStreamSynchronize(s));
}

}  // namespace vmmckpt::ckpt
