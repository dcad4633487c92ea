// Block checksums computed on the GPU: the kernel of block_checksums.cu, loaded from the PTX built into cuda-ckpt.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vmmckpt::ckpt {

// Device memory whose bytes are a span's stored bytes, contiguous.
struct device_span {
  CUdeviceptr src = 0;
  std::uint64_t bytes = 0;
};

class gpu_checksums {
 public:
  // Loads the kernel into the current context and checks it on a test buffer against the CPU's
  // image::block_checksum. Never throws: without a usable kernel (a driver without modules, as the
  // emulated one; a build without nvcc; a failed check) available() is false and why() says why.
  gpu_checksums();
  ~gpu_checksums();
  gpu_checksums(const gpu_checksums&) = delete;
  gpu_checksums& operator=(const gpu_checksums&) = delete;

  bool available() const { return function_ != nullptr; }
  const std::string& why() const { return why_; }

  // The block checksums (image::write_block_size blocks) of every span, span after span, computed on
  // `stream` and copied to the host; returns when they are there. Throws tool_error on a CUDA failure.
  std::vector<std::uint64_t> compute(const std::vector<device_span>& spans, CUstream stream) const;

 private:
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  std::string why_;
};

}  // namespace vmmckpt::ckpt
