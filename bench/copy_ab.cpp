// The shim's cost per same-device copy call, measured inside one process as bench/launch_ab.cu measures
// launches: batches of small cuMemcpyDtoDAsync calls through the entry point cuGetProcAddress hands out
// (under the shim, its gated wrapper) alternate with batches through the driver's own. For comparison the
// same for cuStreamWriteValue32, which passes the same gate but copies nothing: the difference between the
// two added costs is what copies pay beyond the gate (the peer-access check, docs/pool.md: one relaxed load
// while one device has a pool). Natively the two functions of each pair are the same: the control.
//
//   vmmckpt_bench_copy_ab [--calls N] [--batches B] [--bytes S]
//
// B (default 1000) pairs of batches of N (default 500) calls, S (default 256) bytes each, the order within a
// pair alternating. One JSON line (ns per call; medians of batches, added_ns: median of pair differences):
//   {"bench":"copy_ab","calls":N,"batches":B,"bytes":S,"same_function":bool,"copy_handed_ns":..,
//    "copy_driver_ns":..,"copy_added_ns":..,"write_added_ns":..}
#include <cuda.h>

#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

using copy_fn = CUresult(CUDAAPI*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
using write_fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

template <typename Fn>
Fn handed(const char* name) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult found{};
  VMMCKPT_CHECK(cuGetProcAddress(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found));
  return reinterpret_cast<Fn>(p);
}

// Seconds spent in the calls alone; the stream is drained after the clock stops.
template <typename Call>
double batch(Call call, CUstream stream, long calls) {
  const auto t0 = bench::clock_type::now();
  for (long i = 0; i < calls; ++i) VMMCKPT_CHECK(call());
  const double s = bench::seconds_since(t0);
  VMMCKPT_CHECK(cuStreamSynchronize(stream));
  return s;
}

struct ab {
  std::vector<double> handed, driver, diff;
};

template <typename Handed, typename Driver>
ab alternate(Handed h, Driver d, CUstream stream, long calls, int batches) {
  for (int warm = 0; warm < 20; ++warm) {
    batch(h, stream, calls);
    batch(d, stream, calls);
  }
  ab r;
  for (int b = 0; b < batches; ++b) {
    double th, td;
    if (b % 2 == 0) {
      th = batch(h, stream, calls);
      td = batch(d, stream, calls);
    } else {
      td = batch(d, stream, calls);
      th = batch(h, stream, calls);
    }
    r.handed.push_back(th);
    r.driver.push_back(td);
    r.diff.push_back(th - td);
  }
  for (auto* v : {&r.handed, &r.driver, &r.diff}) std::sort(v->begin(), v->end());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  long calls = 500;
  int batches = 1000;
  std::size_t bytes = 256;
  bench::parse_options(argc, argv, [&](const std::string& a, const std::string& v) {
    if (a == "--calls")
      calls = std::strtol(v.c_str(), nullptr, 0);
    else if (a == "--batches")
      batches = std::atoi(v.c_str());
    else if (a == "--bytes")
      bytes = std::strtoull(v.c_str(), nullptr, 0);
    else
      return false;
    return true;
  });
  if (calls <= 0 || batches <= 0 || bytes == 0)
    bench::usage_error(argv[0], "--calls, --batches and --bytes must be positive");

  VMMCKPT_CHECK(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  VMMCKPT_CHECK(cuDeviceGet(&dev, 0));
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr src = 0, dst = 0, flag = 0;
  VMMCKPT_CHECK(cuMemAlloc(&src, bytes));  // pool memory under the shim: one device, one pool
  VMMCKPT_CHECK(cuMemAlloc(&dst, bytes));
  VMMCKPT_CHECK(cuMemAlloc(&flag, 4));
  CUstream stream;
  VMMCKPT_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  const auto copy_h = handed<copy_fn>("cuMemcpyDtoDAsync");
  const auto copy_d = reinterpret_cast<copy_fn>(bench::driver_own("cuMemcpyDtoDAsync_v2"));
  const auto write_h = handed<write_fn>("cuStreamWriteValue32");
  const auto write_d = reinterpret_cast<write_fn>(bench::driver_own("cuStreamWriteValue32_v2"));
  if (copy_h == nullptr || copy_d == nullptr || write_h == nullptr || write_d == nullptr) {
    std::fprintf(stderr, "%s: cannot find cuMemcpyDtoDAsync or cuStreamWriteValue32\n", argv[0]);
    return 1;
  }
  const ab copy = alternate([&] { return copy_h(dst, src, bytes, stream); },
                            [&] { return copy_d(dst, src, bytes, stream); }, stream, calls, batches);
  const ab write = alternate([&] { return write_h(stream, flag, 1, 0); }, [&] { return write_d(stream, flag, 1, 0); },
                             stream, calls, batches);
  const double ns = 1e9 / static_cast<double>(calls);
  std::printf("{\"bench\":\"copy_ab\",\"calls\":%ld,\"batches\":%d,\"bytes\":%zu,\"same_function\":%s,"
              "\"copy_handed_ns\":%.2f,\"copy_driver_ns\":%.2f,\"copy_added_ns\":%.2f,\"write_added_ns\":%.2f}\n",
              calls, batches, bytes, copy_h == copy_d ? "true" : "false", bench::quantile(copy.handed, 0.5) * ns,
              bench::quantile(copy.driver, 0.5) * ns, bench::quantile(copy.diff, 0.5) * ns,
              bench::quantile(write.diff, 0.5) * ns);
  return 0;
}
