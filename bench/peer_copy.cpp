// A copy between two GPUs: `bytes` (default 1 GiB) from GPU 0 to GPU 1 with cuMemcpyPeerAsync, first without
// peer access, then with it (cuCtxEnablePeerAccess both ways; the order matters: under the shim a disable leaves
// the pools' access as it is, docs/pool.md). scripts/bench.sh runs it natively and under the shim, alternating;
// issue 16's target: with peer access, under the shim within 3 % of native. Natively, without peer access, the
// driver stages the copy through the host; under the shim the pools are VMM memory, which the driver cannot
// stage, so the shim gives both devices access on the first copy and the driver copies directly.
//
//   vmmckpt_bench_peer_copy [--bytes N] [--reps R] [--warmup W]
//
// Each repetition: the copy call and a stream synchronize, timed on the host (what the program waits), and
// the copy alone between two events. After each phase a sample of GPU 1's words is checked against the
// phase's pattern. One JSON line (milliseconds: medians and minimums of R repetitions after W untimed ones):
//   {"bench":"peer_copy","bytes":..,"reps":..,"src":"0x..","dst":"0x..",
//    "no_peer_ms":..,"no_peer_min_ms":..,"no_peer_event_ms":..,"no_peer_gb_per_s":..,
//    "peer_ms":..,"peer_min_ms":..,"peer_event_ms":..,"peer_gb_per_s":..}
// Exits 77 with the reason on stderr with fewer than two GPUs, or two that cannot access each other.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

constexpr int skip_exit = 77;

struct phase_times {
  double median_ms, min_ms, event_ms;
};

struct two_gpus {
  CUcontext ctx0, ctx1;
  CUdeviceptr src = 0, dst = 0;
  CUstream stream;
  CUevent start, stop;
  std::size_t bytes;
};

void enable_peer(CUcontext from, CUcontext to) {
  VMMCKPT_CHECK(cuCtxSetCurrent(from));
  const CUresult r = cuCtxEnablePeerAccess(to, 0);
  if (r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) VMMCKPT_CHECK(r);
}

// Fills GPU 0's buffer with `pattern` and GPU 1's with zeros, so that a copy that did nothing shows.
void prepare(const two_gpus& g, std::uint32_t pattern) {
  VMMCKPT_CHECK(cuCtxSetCurrent(g.ctx1));
  VMMCKPT_CHECK(cuMemsetD32(g.dst, 0, g.bytes / 4));
  VMMCKPT_CHECK(cuCtxSynchronize());
  VMMCKPT_CHECK(cuCtxSetCurrent(g.ctx0));
  VMMCKPT_CHECK(cuMemsetD32(g.src, pattern, g.bytes / 4));
  VMMCKPT_CHECK(cuCtxSynchronize());
}

// A sample of 64 words spread over GPU 1's buffer, the last one included.
void check_copied(const two_gpus& g, std::uint32_t pattern, const char* phase) {
  VMMCKPT_CHECK(cuCtxSetCurrent(g.ctx1));
  const std::size_t words = g.bytes / 4;
  for (int i = 0; i < 64; ++i) {
    const std::size_t at = (i == 63 ? words - 1 : words / 63 * i);
    std::uint32_t got = 0;
    VMMCKPT_CHECK(cuMemcpyDtoH(&got, g.dst + at * 4, 4));
    if (got != pattern) {
      std::fprintf(stderr, "peer_copy: %s: word %zu on GPU 1 is %#x, not %#x: the copy is wrong\n", phase, at, got,
                   pattern);
      std::exit(1);
    }
  }
  VMMCKPT_CHECK(cuCtxSetCurrent(g.ctx0));
}

phase_times copies(const two_gpus& g, int warmup, int reps) {
  VMMCKPT_CHECK(cuCtxSetCurrent(g.ctx0));
  std::vector<double> wall, events;
  for (int i = -warmup; i < reps; ++i) {
    const auto t0 = bench::clock_type::now();
    VMMCKPT_CHECK(cuEventRecord(g.start, g.stream));
    VMMCKPT_CHECK(cuMemcpyPeerAsync(g.dst, g.ctx1, g.src, g.ctx0, g.bytes, g.stream));
    VMMCKPT_CHECK(cuEventRecord(g.stop, g.stream));
    VMMCKPT_CHECK(cuStreamSynchronize(g.stream));
    const double s = bench::seconds_since(t0);
    float ms = 0;
    VMMCKPT_CHECK(cuEventElapsedTime(&ms, g.start, g.stop));
    if (i < 0) continue;
    wall.push_back(s * 1e3);
    events.push_back(ms);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(events.begin(), events.end());
  return {bench::quantile(wall, 0.5), wall.front(), bench::quantile(events, 0.5)};
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = std::size_t{1} << 30;
  int reps = 20, warmup = 3;
  bench::parse_options(argc, argv, [&](const std::string& a, const std::string& v) {
    if (a == "--bytes")
      bytes = std::strtoull(v.c_str(), nullptr, 0);
    else if (a == "--reps")
      reps = std::atoi(v.c_str());
    else if (a == "--warmup")
      warmup = std::atoi(v.c_str());
    else
      return false;
    return true;
  });
  if (bytes < 4 || bytes % 4 != 0 || reps <= 0 || warmup < 0)
    bench::usage_error(argv[0], "--bytes must be a positive multiple of 4, --reps positive, --warmup not negative");

  VMMCKPT_CHECK(cuInit(0));
  int count = 0;
  VMMCKPT_CHECK(cuDeviceGetCount(&count));
  if (count < 2) {
    std::fprintf(stderr, "peer_copy: skipped: a copy between GPUs needs two, this machine has %d\n", count);
    return skip_exit;
  }
  CUdevice dev0, dev1;
  VMMCKPT_CHECK(cuDeviceGet(&dev0, 0));
  VMMCKPT_CHECK(cuDeviceGet(&dev1, 1));
  int can01 = 0, can10 = 0;
  VMMCKPT_CHECK(cuDeviceCanAccessPeer(&can01, dev0, dev1));
  VMMCKPT_CHECK(cuDeviceCanAccessPeer(&can10, dev1, dev0));
  if (!can01 || !can10) {
    // Under the shim such a pair cannot copy pool memory at all (docs/pool.md, "Not covered").
    std::fprintf(stderr, "peer_copy: skipped: GPUs 0 and 1 cannot access each other's memory\n");
    return skip_exit;
  }

  two_gpus g{};
  g.bytes = bytes;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&g.ctx0, dev0));
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&g.ctx1, dev1));
  VMMCKPT_CHECK(cuCtxSetCurrent(g.ctx1));
  VMMCKPT_CHECK(cuMemAlloc(&g.dst, bytes));  // pool memory of GPU 1 under the shim
  VMMCKPT_CHECK(cuCtxSetCurrent(g.ctx0));
  VMMCKPT_CHECK(cuMemAlloc(&g.src, bytes));  // and of GPU 0
  VMMCKPT_CHECK(cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING));
  VMMCKPT_CHECK(cuEventCreate(&g.start, CU_EVENT_DEFAULT));
  VMMCKPT_CHECK(cuEventCreate(&g.stop, CU_EVENT_DEFAULT));

  constexpr std::uint32_t no_peer_pattern = 0xa5c3e10fu, peer_pattern = 0x5a3c1ef0u;
  prepare(g, no_peer_pattern);
  const phase_times no_peer = copies(g, warmup, reps);
  check_copied(g, no_peer_pattern, "without peer access");

  enable_peer(g.ctx0, g.ctx1);
  enable_peer(g.ctx1, g.ctx0);
  prepare(g, peer_pattern);
  const phase_times peer = copies(g, warmup, reps);
  check_copied(g, peer_pattern, "with peer access");

  const auto rate = [&](double ms) { return static_cast<double>(bytes) / (ms * 1e-3) / 1e9; };
  std::printf("{\"bench\":\"peer_copy\",\"bytes\":%zu,\"reps\":%d,\"src\":\"%#llx\",\"dst\":\"%#llx\","
              "\"no_peer_ms\":%.4f,\"no_peer_min_ms\":%.4f,\"no_peer_event_ms\":%.4f,\"no_peer_gb_per_s\":%.2f,"
              "\"peer_ms\":%.4f,\"peer_min_ms\":%.4f,\"peer_event_ms\":%.4f,\"peer_gb_per_s\":%.2f}\n",
              bytes, reps, static_cast<unsigned long long>(g.src), static_cast<unsigned long long>(g.dst),
              no_peer.median_ms, no_peer.min_ms, no_peer.event_ms, rate(no_peer.median_ms), peer.median_ms, peer.min_ms,
              peer.event_ms, rate(peer.median_ms));
  return 0;
}
