// The block checksums the GPU computes for one copy.
#include "copy/copy_checksums.hpp"

namespace vmmckpt::ckpt {

copy_checksums::copy_checksums(const std::vector<chunk>& chunks, gpu_checksums* kernel, CUstream stream)
    : chunks_(chunks), kernel_(kernel), stream_(stream), at_(chunks.size()) {
  for (std::size_t c = 0; c < chunks.size(); ++c) at_[c].assign(chunks[c].spans.size(), {nullptr, 0});
}

void copy_checksums::hash(const std::vector<CUdeviceptr>& snapshot_at, const local_fn& local, image_result& result) {
  if (!on_gpu()) {
    result.checksums_why = kernel_ != nullptr ? kernel_->why() : "not asked for (--cpu-checksums)";
    return;
  }
  result.checksums = "gpu";
  std::vector<device_span> spans;
  std::uint64_t blocks = 0;
  std::vector<std::pair<std::size_t, std::size_t>> hashed;  // chunk, span
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    for (std::size_t k = 0; k < chunks_[c].spans.size(); ++k) {
      const span& sp = chunks_[c].spans[k];
      if (sp.piece_count != 1) continue;
      at_[c][k].second = blocks;
      hashed.emplace_back(c, k);
      spans.push_back({snapshot_at.empty() ? local(sp.addr) : snapshot_at[c] + sp.offset, sp.stored});
      blocks += image::block_count(sp.stored, image::write_block_size);
    }
  in_place_ = snapshot_at.empty();
  batch_ = kernel_->launch(spans, stream_);
  for (const auto& [c, k] : hashed) at_[c][k].first = batch_.get();
}

void copy_checksums::summarize(image_result& result) const {
  if (batch_ == nullptr) return;
  if (batch_->wait() == nullptr) {  // its spans were hashed by the writers
    result.checksums = "cpu";
    result.checksums_why = batch_->why();
  }
  result.checksum_seconds = batch_->seconds();
}

}  // namespace vmmckpt::ckpt
