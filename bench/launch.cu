// A launch-bound program: the cost of the shim's gate, which every kernel launch passes.
//
//   vmmckpt_bench_launch [--launches N] [--reps R]
//
// N (default 1000000) empty <<<1,1>>> launches on one stream, then a synchronize, timed; R (default 3)
// repetitions after a warm-up of 10000 launches. One JSON line:
//   {"bench":"launch","launches":N,"seconds":best,"us_per_launch":..,"best_seconds":..,
//    "median_seconds":..,"all_seconds":[..]}
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

__global__ void empty_kernel() {}

double launch_batch(cudaStream_t stream, long launches) {
  const auto t0 = bench::clock_type::now();
  for (long i = 0; i < launches; ++i) empty_kernel<<<1, 1, 0, stream>>>();
  VMMCKPT_CHECK(cudaStreamSynchronize(stream));
  const double s = bench::seconds_since(t0);
  VMMCKPT_CHECK(cudaGetLastError());  // a failed launch would make the batch meaninglessly fast
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long launches = 1000000;
  int reps = 3;
  bench::parse_options(argc, argv, [&](const std::string& a, const std::string& v) {
    if (a == "--launches")
      launches = std::strtol(v.c_str(), nullptr, 0);
    else if (a == "--reps")
      reps = std::atoi(v.c_str());
    else
      return false;
    return true;
  });
  if (launches <= 0 || reps <= 0) bench::usage_error(argv[0], "--launches and --reps must be positive");

  cudaStream_t stream;
  VMMCKPT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  launch_batch(stream, 10000);
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) seconds.push_back(launch_batch(stream, launches));
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const double best = sorted.front();
  std::string all;
  for (double s : seconds) all += (all.empty() ? "" : ",") + std::to_string(s);
  std::printf("{\"bench\":\"launch\",\"launches\":%ld,\"seconds\":%.6f,\"us_per_launch\":%.4f,\"best_seconds\":%.6f,"
              "\"median_seconds\":%.6f,\"all_seconds\":[%s]}\n",
              launches, best, best / static_cast<double>(launches) * 1e6, best, bench::quantile(sorted, 0.5),
              all.c_str());
  return 0;
}
