// The program a dump, a suspend or the driver's checkpoint works on: live allocations of a known
// size holding a pattern that can be checked at any time, in this process or in a restored one.
//
//   vmmckpt_bench_fill --gib N [--piece-mib M] --pointers FILE
//       cudaMalloc N GiB (or --mib N) in pieces of M MiB (default 1024), fill word k of piece p with
//       fill_word(p, k) by a kernel, write "0xADDR SIZE" per piece to FILE, print "ready"; then stay
//       a live GPU program (a small kernel every 10 ms on a buffer of its own) until stdin closes.
//       Each stdin line "check" verifies every piece on the device: "check ok" or "check FAILED n".
//       --until FILE instead of stdin: run until FILE exists, then check and exit. --churn P: every tick
//       rewrites P % of each piece (the pattern XOR the tick's number), checked as such.
//   vmmckpt_bench_fill --verify-pointers FILE
//       allocate nothing; check that the pieces FILE lists hold the pattern (in a process started by
//       `cuda-ckpt restore IMAGE -- ...`, where they are back at their addresses); exit 0 or 1.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "fill_common.hpp"

namespace {

constexpr int threads_per_block = 256;
constexpr int blocks = 2048;  // a grid-stride loop: enough to fill an H100/H200

__global__ void fill_kernel(std::uint64_t* words, std::uint64_t count, std::uint64_t piece) {
  for (std::uint64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += std::uint64_t(gridDim.x) * blockDim.x)
    words[k] = bench::fill_word(piece, k);
}

// Words [0, churned) hold the pattern XOR the last tick's number (--churn); of the others, words [0, flipped)
// hold the pattern XOR flip_mask (stdin's "flip"), the rest the pattern.
__global__ void count_kernel(const std::uint64_t* words, std::uint64_t count, std::uint64_t piece,
                             std::uint64_t flipped, std::uint64_t churned, std::uint64_t tick,
                             unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (std::uint64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += std::uint64_t(gridDim.x) * blockDim.x)
    bad += words[k] != (bench::fill_word(piece, k) ^ (k < churned ? tick : k < flipped ? bench::flip_mask : 0));
  if (bad != 0) atomicAdd(mismatches, bad);
}

__global__ void flip_kernel(std::uint64_t* words, std::uint64_t count) {
  for (std::uint64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += std::uint64_t(gridDim.x) * blockDim.x)
    words[k] ^= bench::flip_mask;
}

__global__ void churn_kernel(std::uint64_t* words, std::uint64_t count, std::uint64_t piece, std::uint64_t tick) {
  for (std::uint64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < count; k += std::uint64_t(gridDim.x) * blockDim.x)
    words[k] = bench::fill_word(piece, k) ^ tick;
}

__global__ void tick_kernel(unsigned int* counters) { ++counters[threadIdx.x]; }

std::uint64_t count_mismatches(const std::vector<bench::piece>& pieces, unsigned long long* counter,
                               std::uint64_t flipped_percent = 0, std::uint64_t churn_percent = 0,
                               std::uint64_t tick = 0) {
  VMMCKPT_CHECK(cudaMemset(counter, 0, sizeof *counter));
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    const std::uint64_t words = pieces[p].size / 8;
    count_kernel<<<blocks, threads_per_block>>>(reinterpret_cast<const std::uint64_t*>(pieces[p].addr), words, p,
                                                words * flipped_percent / 100,
                                                tick == 0 ? 0 : words * churn_percent / 100, tick, counter);
  }
  VMMCKPT_CHECK(cudaGetLastError());
  unsigned long long bad = 0;
  VMMCKPT_CHECK(cudaMemcpy(&bad, counter, sizeof bad, cudaMemcpyDeviceToHost));
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::fill_options o = bench::parse_fill_options(argc, argv);
  // Under `cuda-ckpt restore` the image comes back at the process's first memory call: make it now.
  VMMCKPT_CHECK(cudaFree(nullptr));
  unsigned long long* counter = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&counter, sizeof *counter));

  if (o.verify_only) {
    const auto pieces = bench::read_pointers(o.pointers);
    return bench::report_check(count_mismatches(pieces, counter)) ? 0 : 1;
  }

  auto pieces = bench::plan_pieces(o);
  const auto t0 = bench::clock_type::now();
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    void* d = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&d, pieces[p].size));
    pieces[p].addr = reinterpret_cast<std::uint64_t>(d);
    fill_kernel<<<blocks, threads_per_block>>>(static_cast<std::uint64_t*>(d), pieces[p].size / 8, p);
    VMMCKPT_CHECK(cudaGetLastError());
  }
  VMMCKPT_CHECK(cudaDeviceSynchronize());
  std::fprintf(stderr, "vmmckpt_bench_fill: %zu pieces, %.2f GiB filled in %.3f s\n", pieces.size(),
               static_cast<double>(o.bytes) / (1ULL << 30), bench::seconds_since(t0));
  bench::write_pointers(o.pointers, pieces);

  unsigned int* tick_buffer = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&tick_buffer, 32 * sizeof *tick_buffer));
  std::uint64_t flipped_percent = 0;  // the share of each piece now flipped
  std::uint64_t ticks = 0;            // with --churn: the last tick's number, which its share holds
  const auto churn_percent = static_cast<std::uint64_t>(o.churn_percent);
  cudaStream_t tick_stream;
  VMMCKPT_CHECK(cudaStreamCreateWithFlags(&tick_stream, cudaStreamNonBlocking));
  return bench::serve(
      [&] {
        if (churn_percent > 0) {
          ++ticks;
          for (std::size_t p = 0; p < pieces.size(); ++p)
            churn_kernel<<<blocks, threads_per_block, 0, tick_stream>>>(
                reinterpret_cast<std::uint64_t*>(pieces[p].addr), pieces[p].size / 8 * churn_percent / 100, p, ticks);
        }
        tick_kernel<<<1, 32, 0, tick_stream>>>(tick_buffer);
        VMMCKPT_CHECK(cudaGetLastError());
        VMMCKPT_CHECK(cudaStreamSynchronize(tick_stream));
      },
      [&] { return count_mismatches(pieces, counter, flipped_percent, churn_percent, ticks); }, o.until,
      [&](int percent) {
        // Flipping the same share again undoes it; another share starts from the pattern.
        for (std::size_t p = 0; p < pieces.size(); ++p)
          flip_kernel<<<blocks, threads_per_block>>>(reinterpret_cast<std::uint64_t*>(pieces[p].addr),
                                                     pieces[p].size / 8 * static_cast<std::uint64_t>(percent) / 100);
        VMMCKPT_CHECK(cudaDeviceSynchronize());
        flipped_percent = flipped_percent == 0 ? static_cast<std::uint64_t>(percent) : 0;
      });
}
