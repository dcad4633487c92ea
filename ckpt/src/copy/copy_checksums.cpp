// The block checksums the GPU computes for one copy.
#include "copy/copy_checksums.hpp"

#include <algorithm>

namespace vmmckpt::ckpt {

copy_checksums::copy_checksums(const std::vector<chunk>& chunks, gpu_checksums* kernel, CUstream stream)
    : chunks_(chunks), kernel_(kernel), stream_(stream), at_(chunks.size()) {
  for (std::size_t c = 0; c < chunks.size(); ++c) at_[c].assign(chunks[c].spans.size(), {nullptr, 0});
}

std::unique_ptr<gpu_checksums::batch> copy_checksums::launch(std::size_t from, std::size_t to, bool in_place,
                                                             const std::vector<CUdeviceptr>& snapshot_at) {
  std::vector<device_span> spans;
  std::uint64_t blocks = 0;
  std::vector<std::pair<std::size_t, std::size_t>> hashed;  // chunk, span
  for (std::size_t c = from; c < to; ++c)
    for (std::size_t k = 0; k < chunks_[c].spans.size(); ++k) {
      const span& sp = chunks_[c].spans[k];
      if (sp.piece_count != 1) continue;
      at_[c][k].second = blocks;
      hashed.emplace_back(c, k);
      spans.push_back({in_place ? sp.addr : snapshot_at[c] + sp.offset, sp.stored});
      blocks += image::block_count(sp.stored, image::write_block_size);
    }
  auto batch = kernel_->launch(spans, stream_);
  for (const auto& [c, k] : hashed) at_[c][k].first = batch.get();
  return batch;
}

void copy_checksums::hash_in_place(std::size_t in_place, image_result& result) {
  if (on_gpu()) {
    if (in_place > 0) in_place_ = launch(0, in_place, true, {});
    result.checksums = "gpu";
  } else {
    result.checksums_why = kernel_ != nullptr ? kernel_->why() : "not asked for (--cpu-checksums)";
  }
}

void copy_checksums::hash_in_snapshot(std::size_t from, const std::vector<CUdeviceptr>& snapshot_at) {
  in_snapshot_ = launch(from, chunks_.size(), false, snapshot_at);
}

void copy_checksums::summarize(image_result& result) const {
  for (auto* batch : {in_place_.get(), in_snapshot_.get()}) {
    if (batch == nullptr) continue;
    if (batch->wait() == nullptr) {  // its spans were hashed by the writers
      result.checksums = "cpu";
      result.checksums_why = batch->why();
    }
    result.checksum_seconds = std::max(result.checksum_seconds, batch->seconds());
  }
}

}  // namespace vmmckpt::ckpt
