// Block checksums computed on the GPU: the kernel of block_checksums.cu, from the fatbinary built into cuda-ckpt.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
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

  // The block checksums of a list of spans, on their way: queued on a stream, there once waited for.
  class batch {
   public:
    batch() = default;
    ~batch();
    batch(const batch&) = delete;
    batch& operator=(const batch&) = delete;
    // The block checksums (image::write_block_size blocks) of every span, span after span, once the
    // kernel is done; null when it failed (the CPU computes them instead). From any thread; every call
    // gives what the first gave.
    const std::uint64_t* wait();
    // After a wait that gave the checksums: per block, 1 when its bytes are all zero (in the same order).
    const unsigned char* zeros() const { return reinterpret_cast<const unsigned char*>(host_ + blocks_); }
    const std::string& why() const { return why_; }   // after a wait that gave null
    double seconds() const { return seconds_; }       // from the launch to the first wait's return
    std::uint64_t blocks() const { return blocks_; }  // how many checksums wait() gives

   private:
    friend class gpu_checksums;
    CUdeviceptr table_ = 0, sums_ = 0;
    // pinned, copied into without holding up the launching thread: the checksums, then a byte a block
    std::uint64_t* host_ = nullptr;
    CUevent done_ = nullptr;
    std::uint64_t blocks_ = 0;
    std::once_flag waited_;
    bool failed_ = false;
    std::string why_;
    double launched_at_ = 0, seconds_ = 0;
  };

  // Queues the kernel for `spans` on `stream` (which must not be waited on by anything that must not wait
  // for the checksums) and the copy of its results to the host. Never throws: a CUDA failure leaves the
  // batch failed (wait() gives null, why() says why).
  std::unique_ptr<batch> launch(const std::vector<device_span>& spans, CUstream stream) const;
  // launch() and wait(), for the self-test: throws tool_error on a failure. The checksums, and which blocks
  // are all zeros.
  struct sums_and_zeros {
    std::vector<std::uint64_t> sums;
    std::vector<unsigned char> zeros;
  };
  sums_and_zeros compute(const std::vector<device_span>& spans, CUstream stream) const;

 private:
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  std::string why_;
};

}  // namespace vmmckpt::ckpt
