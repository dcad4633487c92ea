// Image format 5's block checksums computed on the GPU (docs/image-format.md, "Blocks"): compiled to PTX at build
// time, embedded in cuda-ckpt and loaded with cuModuleLoadData (ckpt/src/gpu_checksums.cpp). One thread per block.
#include "vmmckpt/xxh3_portable.hpp"

// Device memory whose bytes are a span's stored bytes, contiguous: its blocks' checksums go to out[first...].
struct vmmckpt_span {
  unsigned long long src, bytes, first;
};

extern "C" __global__ void vmmckpt_block_checksums(const vmmckpt_span* spans, unsigned long long span_count,
                                                   unsigned long long blocks, unsigned long long block_bytes,
                                                   unsigned long long* out) {
  const unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= blocks) return;
  unsigned long long lo = 0, hi = span_count;  // the span whose blocks include block i
  while (hi - lo > 1) {
    const unsigned long long mid = (lo + hi) / 2;
    if (spans[mid].first <= i) lo = mid; else hi = mid;
  }
  const vmmckpt_span s = spans[lo];
  const unsigned long long at = (i - s.first) * block_bytes;
  const unsigned long long n = s.bytes - at < block_bytes ? s.bytes - at : block_bytes;
  out[i] = vmmckpt::xxh3::hash64(reinterpret_cast<const unsigned char*>(s.src + at), n);
}
