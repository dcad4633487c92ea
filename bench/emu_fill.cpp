// vmmckpt_bench_fill for the driver API alone, so that it also runs on the emulated driver (whose
// kernels do not exist and which NVIDIA's runtime refuses): the CPU-only dump/restore round trip of
// scripts/bench.sh --cpu-only. Same options, output and pattern as bench/fill.cu:
//
//   vmmckpt_bench_emu_fill --mib N [--piece-mib M] --pointers FILE    fill, "ready", serve "check"
//   vmmckpt_bench_emu_fill --verify-pointers FILE                      check a restored process, exit 0/1
//
// The pattern goes in and out through host copies instead of kernels, in slices of 16 MiB.
#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fill_common.hpp"

namespace {

constexpr std::uint64_t slice_bytes = 16ULL << 20;

void fill_slice(std::vector<std::uint64_t>& host, std::uint64_t piece, std::uint64_t first_word, std::uint64_t words) {
  for (std::uint64_t k = 0; k < words; ++k) host[k] = bench::fill_word(piece, first_word + k);
}

std::uint64_t count_mismatches(const std::vector<bench::piece>& pieces) {
  std::vector<std::uint64_t> back(slice_bytes / 8), expected(slice_bytes / 8);
  std::uint64_t bad = 0;
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    for (std::uint64_t at = 0; at < pieces[p].size; at += slice_bytes) {
      const std::uint64_t n = std::min(slice_bytes, pieces[p].size - at);
      VMMCKPT_CHECK(cuMemcpyDtoH(back.data(), pieces[p].addr + at, n));
      fill_slice(expected, p, at / 8, n / 8);
      for (std::uint64_t k = 0; k < n / 8; ++k) bad += back[k] != expected[k];
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::fill_options o = bench::parse_fill_options(argc, argv);
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  // Under `cuda-ckpt restore` the image comes back at the process's first memory call: make it now.
  CUdeviceptr tick_buffer = 0;
  VMMCKPT_CHECK(cuMemAlloc(&tick_buffer, 4096));

  if (o.verify_only) return bench::report_check(count_mismatches(bench::read_pointers(o.pointers))) ? 0 : 1;

  auto pieces = bench::plan_pieces(o);
  std::vector<std::uint64_t> host(slice_bytes / 8);
  const auto t0 = bench::clock_type::now();
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    CUdeviceptr d = 0;
    VMMCKPT_CHECK(cuMemAlloc(&d, pieces[p].size));
    pieces[p].addr = d;
    for (std::uint64_t at = 0; at < pieces[p].size; at += slice_bytes) {
      const std::uint64_t n = std::min(slice_bytes, pieces[p].size - at);
      fill_slice(host, p, at / 8, n / 8);
      VMMCKPT_CHECK(cuMemcpyHtoD(d + at, host.data(), n));
    }
  }
  std::fprintf(stderr, "vmmckpt_bench_emu_fill: %zu pieces, %.1f MiB filled in %.3f s\n", pieces.size(),
               static_cast<double>(o.bytes) / (1 << 20), bench::seconds_since(t0));
  bench::write_pointers(o.pointers, pieces);

  CUstream tick_stream;
  VMMCKPT_CHECK(cuStreamCreate(&tick_stream, CU_STREAM_NON_BLOCKING));
  unsigned int generation = 0;
  return bench::serve(
      [&] {
        VMMCKPT_CHECK(cuCtxSetCurrent(ctx));  // the tick runs on a thread of its own
        VMMCKPT_CHECK(cuMemsetD32Async(tick_buffer, ++generation, 1024, tick_stream));
        VMMCKPT_CHECK(cuStreamSynchronize(tick_stream));
      },
      [&] { return count_mismatches(pieces); });
}
