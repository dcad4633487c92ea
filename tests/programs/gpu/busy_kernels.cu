// GPU test program: kernels keep rewriting pool buffers under an invariant while the program is dumped.
//
// Each launch rewrites one whole buffer with the pattern of
// contracts/busy_pattern.hpp, as the emulator's busy_writer does. A consistent
// image holds every buffer whole at one generation.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "contracts/busy_pattern.hpp"
#include "gpu_check.cuh"

__global__ void rewrite(unsigned long long* words, size_t count, unsigned long long generation,
                        unsigned long long buffer) {
  for (size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += size_t(gridDim.x) * blockDim.x)
    words[k] = vmmckpt::contracts::busy_word(generation, buffer, k, count);
}

int main(int argc, char** argv) {
  const auto options =
      vmmckpt::contracts::parse_busy_options(argc, argv, {.streams = 4, .seconds = 120, .size = 64ull << 20});
  const int buffers = options.buffers, streams = options.streams, seconds = options.seconds;
  const size_t size = options.size;
  std::vector<unsigned long long*> ptrs(buffers);
  for (int b = 0; b < buffers; ++b) {
    VMMCKPT_CHECK(cudaMalloc(&ptrs[b], size));
    VMMCKPT_CHECK(cudaMemset(ptrs[b], 0, size));
    gpu_check::print_ptr(ptrs[b], size, "cudaMalloc");
  }
  VMMCKPT_CHECK(cudaDeviceSynchronize());
  std::printf("ready\n");
  std::fflush(stdout);

  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::atomic<unsigned long long> launches{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < streams; ++t) {
    workers.emplace_back([&, t] {
      cudaStream_t stream;
      VMMCKPT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      unsigned long long generation = 0;
      while (std::chrono::steady_clock::now() < stop_at) {
        ++generation;
        for (int b = t; b < buffers; b += streams) {
          rewrite<<<264, 256, 0, stream>>>(ptrs[b], size / 8, generation, b);
          VMMCKPT_CHECK(cudaGetLastError());
          ++launches;
        }
        if (generation % 8 == 0) VMMCKPT_CHECK(cudaStreamSynchronize(stream));
      }
      VMMCKPT_CHECK(cudaStreamSynchronize(stream));
      VMMCKPT_CHECK(cudaStreamDestroy(stream));
    });
  }
  // Allocation churn alongside, through the runtime.
  while (std::chrono::steady_clock::now() < stop_at) {
    void* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, 3 << 20));
    VMMCKPT_CHECK(cudaFree(p));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& w : workers) w.join();
  std::printf("done %llu launches\n", launches.load());
  return 0;
}
