// The shim's cost per kernel launch, measured inside one process so that the machine's drift between
// runs cancels out: batches of empty launches through the entry point the CUDA runtime is handed
// (cuGetProcAddress: under the shim, its gated wrapper) alternate with batches through the driver's
// own cuLaunchKernel (looked up in libcuda itself, past any interposer). Only the launch calls are
// timed, not the GPU running them: a batch is small enough to fit in the launch queue and is drained
// before the next. Natively the two are the same function, so the native run is the control: its
// difference shows what the method cannot resolve.
//
//   vmmckpt_bench_launch_ab [--launches N] [--batches B]
//
// B (default 1000) pairs of batches of N (default 500) <<<1,1>>> launches, the order within a pair
// alternating. One JSON line (ns per launch call):
//   {"bench":"launch_ab","launches":N,"batches":B,"same_function":bool,"handed_ns":median,
//    "driver_ns":median,"handed_best_ns":..,"driver_best_ns":..,"added_ns":median of pair differences}
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

__global__ void empty_kernel() {}

using launch_fn = CUresult(CUDAAPI*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     CUstream, void**, void**);

launch_fn driver_own_launch() { return reinterpret_cast<launch_fn>(bench::driver_own("cuLaunchKernel")); }

launch_fn handed_launch() {
  void* p = nullptr;
  CUdriverProcAddressQueryResult found{};
  VMMCKPT_CHECK(cuGetProcAddress("cuLaunchKernel", &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found));
  return reinterpret_cast<launch_fn>(p);
}

// Seconds spent in the launch calls alone; the queue is drained after the clock stops.
double batch(launch_fn launch, CUfunction f, CUstream stream, long launches) {
  const auto t0 = bench::clock_type::now();
  for (long i = 0; i < launches; ++i) VMMCKPT_CHECK(launch(f, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr));
  const double s = bench::seconds_since(t0);
  VMMCKPT_CHECK(cuStreamSynchronize(stream));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long launches = 500;
  int batches = 1000;
  bench::parse_options(argc, argv, [&](const std::string& a, const std::string& v) {
    if (a == "--launches")
      launches = std::strtol(v.c_str(), nullptr, 0);
    else if (a == "--batches")
      batches = std::atoi(v.c_str());
    else
      return false;
    return true;
  });
  if (launches <= 0 || batches <= 0) bench::usage_error(argv[0], "--launches and --batches must be positive");

  VMMCKPT_CHECK(cudaFree(nullptr));  // the runtime's context, current on this thread
  cudaFunction_t fn = nullptr;
  VMMCKPT_CHECK(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(&empty_kernel)));
  const auto f = reinterpret_cast<CUfunction>(fn);
  CUstream stream;
  VMMCKPT_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const launch_fn handed = handed_launch(), driver = driver_own_launch();
  if (handed == nullptr || driver == nullptr) {
    std::fprintf(stderr, "%s: cannot find cuLaunchKernel (%s)\n", argv[0], handed ? "in libcuda" : "cuGetProcAddress");
    return 1;
  }

  for (int warm = 0; warm < 20; ++warm) {  // both paths, and the driver's queue, warmed up
    batch(handed, f, stream, launches);
    batch(driver, f, stream, launches);
  }
  std::vector<double> by_handed, by_driver, pair_diff;
  for (int b = 0; b < batches; ++b) {
    double h, d;
    if (b % 2 == 0) {
      h = batch(handed, f, stream, launches);
      d = batch(driver, f, stream, launches);
    } else {
      d = batch(driver, f, stream, launches);
      h = batch(handed, f, stream, launches);
    }
    by_handed.push_back(h);
    by_driver.push_back(d);
    pair_diff.push_back(h - d);
  }
  for (auto* v : {&by_handed, &by_driver, &pair_diff}) std::sort(v->begin(), v->end());
  const double ns = 1e9 / static_cast<double>(launches);
  std::printf("{\"bench\":\"launch_ab\",\"launches\":%ld,\"batches\":%d,\"same_function\":%s,\"handed_ns\":%.2f,"
              "\"driver_ns\":%.2f,\"handed_best_ns\":%.2f,\"driver_best_ns\":%.2f,\"added_ns\":%.2f}\n",
              launches, batches, handed == driver ? "true" : "false", bench::quantile(by_handed, 0.5) * ns,
              bench::quantile(by_driver, 0.5) * ns, by_handed.front() * ns, by_driver.front() * ns,
              bench::quantile(pair_diff, 0.5) * ns);
  return 0;
}
