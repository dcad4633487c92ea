// Pool memory overhead: physical GPU memory held against bytes live, for a fragmenting pattern.
//
//   vmmckpt_bench_frag [--live-gib 8] [--steps 20000] [--seed 42]
//
// A fixed pseudo-random sequence of cudaMalloc/cudaFree, sizes log-uniform from 4 KiB to 64 MiB:
// allocate until --live-gib are live, then churn --steps times (free a random live block, allocate a
// new random size). Physical memory is the device's used memory (NVML, which the shim does not
// interpose: the shim's cudaMemGetInfo counts its reusable pool memory as free) less what was used
// before the first allocation; without NVML, cudaMemGetInfo's. Sampled after the rise, every 500
// steps and at the end. One JSON line:
//   {"bench":"frag","live_bytes":L,"physical_bytes":P,"ratio":P/L,"peak_live_bytes":..,
//    "peak_physical_bytes":..,"peak_ratio":..,"blocks":..,"steps":..,"memory_source":"nvml"}
// live/physical are at the end; peak_* at the sample with the most physical memory.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "frag_pattern.hpp"

namespace {

// The three NVML calls needed, looked up at run time: the toolkit has no NVML stub to link here.
struct nvml_memory {
  unsigned long long total, free, used;
};
using nvml_device = void*;

class device_memory {
 public:
  explicit device_memory(int device) {
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto init = reinterpret_cast<int (*)()>(::dlsym(lib, "nvmlInit_v2"));
    auto by_bus =
        reinterpret_cast<int (*)(const char*, nvml_device*)>(::dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    get_info_ = reinterpret_cast<int (*)(nvml_device, nvml_memory*)>(::dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    char bus_id[64] = {};
    if (init == nullptr || by_bus == nullptr || get_info_ == nullptr || init() != 0 ||
        cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess || by_bus(bus_id, &device_) != 0)
      get_info_ = nullptr;
  }
  const char* source() const { return get_info_ != nullptr ? "nvml" : "cudaMemGetInfo"; }
  std::uint64_t used() const {
    if (get_info_ == nullptr) {
      size_t free_bytes = 0, total = 0;
      VMMCKPT_CHECK(cudaMemGetInfo(&free_bytes, &total));
      return total - free_bytes;
    }
    nvml_memory m{};
    if (get_info_(device_, &m) != 0) {
      std::fprintf(stderr, "vmmckpt_bench_frag: nvmlDeviceGetMemoryInfo failed\n");
      std::exit(1);
    }
    return m.used;
  }

 private:
  nvml_device device_ = nullptr;
  int (*get_info_)(nvml_device, nvml_memory*) = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  double live_gib = 8;
  long steps = 20000;
  std::uint64_t seed = 42;
  bench::parse_options(argc, argv, [&](const std::string& a, const std::string& v) {
    if (a == "--live-gib")
      live_gib = std::strtod(v.c_str(), nullptr);
    else if (a == "--steps")
      steps = std::strtol(v.c_str(), nullptr, 0);
    else if (a == "--seed")
      seed = std::strtoull(v.c_str(), nullptr, 0);
    else
      return false;
    return true;
  });
  if (!(live_gib > 0) || steps < 0) bench::usage_error(argv[0], "bad --live-gib or --steps");

  VMMCKPT_CHECK(cudaFree(nullptr));
  int device = 0;
  VMMCKPT_CHECK(cudaGetDevice(&device));
  const device_memory memory(device);
  const std::uint64_t used_at_start = memory.used();

  std::uint64_t peak_live = 0, peak_physical = 0;
  auto sample = [&](std::uint64_t live_now) {
    const std::uint64_t used = memory.used();
    const std::uint64_t physical = used > used_at_start ? used - used_at_start : 0;
    if (physical >= peak_physical) {
      peak_physical = physical;
      peak_live = live_now;
    }
    return physical;
  };
  std::vector<std::pair<void*, std::uint64_t>> live;
  const std::uint64_t live_bytes = bench::run_frag_pattern<void*>(
      static_cast<std::uint64_t>(live_gib * (1ULL << 30)), steps, seed,
      [](std::uint64_t size) {
        void* p = nullptr;
        VMMCKPT_CHECK(cudaMalloc(&p, size));
        return p;
      },
      [](void* p) { VMMCKPT_CHECK(cudaFree(p)); }, sample, live);
  VMMCKPT_CHECK(cudaDeviceSynchronize());
  const std::uint64_t physical = sample(live_bytes);

  std::printf("{\"bench\":\"frag\",\"live_bytes\":%llu,\"physical_bytes\":%llu,\"ratio\":%.4f,"
              "\"peak_live_bytes\":%llu,\"peak_physical_bytes\":%llu,\"peak_ratio\":%.4f,\"blocks\":%zu,"
              "\"steps\":%ld,\"memory_source\":\"%s\"}\n",
              static_cast<unsigned long long>(live_bytes), static_cast<unsigned long long>(physical),
              static_cast<double>(physical) / static_cast<double>(live_bytes),
              static_cast<unsigned long long>(peak_live), static_cast<unsigned long long>(peak_physical),
              peak_live > 0 ? static_cast<double>(peak_physical) / static_cast<double>(peak_live) : 0.0, live.size(),
              steps, memory.source());
  for (const auto& entry : live) VMMCKPT_CHECK(cudaFree(entry.first));
  return 0;
}
