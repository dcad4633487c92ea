// Emulator test program: streams keep rewriting pool buffers under an invariant while the program is dumped.
//
// Each job rewrites one whole buffer in stream order (a host function is the
// emulator's kernel) with the pattern of contracts/busy_pattern.hpp: a consistent
// image holds every buffer whole at one generation; a torn copy breaks the pattern.
#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"
#include "contracts/busy_pattern.hpp"

using vmmckpt::contracts::print_ptr;

namespace {

struct job {
  std::uint64_t* words;
  std::size_t count;
  std::uint64_t generation;
  std::uint64_t buffer;
};

void rewrite(void* arg) {
  const job* j = static_cast<const job*>(arg);
  for (std::size_t k = 0; k < j->count; ++k)
    j->words[k] = vmmckpt::contracts::busy_word(j->generation, j->buffer, k, j->count);
  delete j;
}

}  // namespace

int main(int argc, char** argv) {
  const auto options = vmmckpt::contracts::parse_busy_options(argc, argv, {.streams = 3});
  const int buffers = options.buffers, streams = options.streams, seconds = options.seconds;
  const std::size_t size = options.size;
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  std::vector<CUdeviceptr> ptrs(buffers);
  for (int b = 0; b < buffers; ++b) {
    VMMCKPT_CHECK(cuMemAlloc(&ptrs[b], size));
    VMMCKPT_CHECK(cuMemsetD8(ptrs[b], 0, size));
    print_ptr(ptrs[b], size, "cuMemAlloc");
  }
  std::printf("ready\n");
  std::fflush(stdout);

  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::atomic<std::uint64_t> jobs{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < streams; ++t) {
    workers.emplace_back([&, t] {
      VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
      CUstream stream;
      VMMCKPT_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
      std::uint64_t generation = 0;
      while (std::chrono::steady_clock::now() < stop_at) {
        ++generation;
        for (int b = t; b < buffers; b += streams) {
          auto* j =
              new job{reinterpret_cast<std::uint64_t*>(ptrs[b]), size / 8, generation, static_cast<std::uint64_t>(b)};
          VMMCKPT_CHECK(cuLaunchHostFunc(stream, rewrite, j));
          ++jobs;
        }
        if (generation % 4 == 0) VMMCKPT_CHECK(cuStreamSynchronize(stream));  // bounded queue
      }
      VMMCKPT_CHECK(cuStreamSynchronize(stream));
      VMMCKPT_CHECK(cuStreamDestroy(stream));
    });
  }
  // Allocation churn alongside: the gate covers the allocator too.
  while (std::chrono::steady_clock::now() < stop_at) {
    CUdeviceptr p = 0;
    VMMCKPT_CHECK(cuMemAlloc(&p, 3 << 20));
    VMMCKPT_CHECK(cuMemFree(p));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& w : workers) w.join();
  std::printf("done %llu jobs\n", static_cast<unsigned long long>(jobs.load()));
  return 0;
}
