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

#include "check.hpp"
#include "contracts/busy_pattern.hpp"

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
  int buffers = 8, streams = 3, seconds = 60;
  std::size_t size = 1 << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--buffers") buffers = std::atoi(argv[i + 1]);
    else if (flag == "--streams") streams = std::atoi(argv[i + 1]);
    else if (flag == "--seconds") seconds = std::atoi(argv[i + 1]);
    else if (flag == "--size") size = std::strtoull(argv[i + 1], nullptr, 0);
  }
  CHECK_CU(cuInit(0));
  CUcontext ctx;
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_CU(cuCtxSetCurrent(ctx));
  std::vector<CUdeviceptr> ptrs(buffers);
  for (int b = 0; b < buffers; ++b) {
    CHECK_CU(cuMemAlloc(&ptrs[b], size));
    CHECK_CU(cuMemsetD8(ptrs[b], 0, size));
    print_ptr(ptrs[b], size, "cuMemAlloc");
  }
  std::printf("ready\n");
  std::fflush(stdout);

  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::atomic<std::uint64_t> jobs{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < streams; ++t) {
    workers.emplace_back([&, t] {
      CHECK_CU(cuCtxSetCurrent(ctx));
      CUstream stream;
      CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
      std::uint64_t generation = 0;
      while (std::chrono::steady_clock::now() < stop_at) {
        ++generation;
        for (int b = t; b < buffers; b += streams) {
          auto* j = new job{reinterpret_cast<std::uint64_t*>(ptrs[b]), size / 8, generation, static_cast<std::uint64_t>(b)};
          CHECK_CU(cuLaunchHostFunc(stream, rewrite, j));
          ++jobs;
        }
        if (generation % 4 == 0) CHECK_CU(cuStreamSynchronize(stream));  // bounded queue
      }
      CHECK_CU(cuStreamSynchronize(stream));
      CHECK_CU(cuStreamDestroy(stream));
    });
  }
  // Allocation churn alongside: the gate covers the allocator too.
  while (std::chrono::steady_clock::now() < stop_at) {
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAlloc(&p, 3 << 20));
    CHECK_CU(cuMemFree(p));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& w : workers) w.join();
  std::printf("done %llu jobs\n", static_cast<unsigned long long>(jobs.load()));
  return 0;
}
