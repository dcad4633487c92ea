// What the shim costs a program that maps VMM memory itself, as PyTorch's expandable segments grow: run
// natively and under the shim (scripts/bench.sh runs both, alternating).
//
//   vmmckpt_bench_vmm_calls [--size-mib 20] [--count 64] [--rounds 20]
//
// One reservation of count × size; each round creates `count` handles of `size`, maps each at its place
// and gives it access (cuMemCreate + cuMemMap + cuMemSetAccess, timed per handle, the figure compared),
// then unmaps and releases them (timed apart). Prints one JSON line:
//   {"bench":"vmm_calls","size_mib":..,"count":..,"rounds":..,"create_map_access_us":median,
//    "create_map_access_p90_us":..,"unmap_release_us":median}
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_util.hpp"

int main(int argc, char** argv) {
  std::size_t size_mib = 20, count = 64, rounds = 20;
  bench::parse_options(argc, argv, [&](const std::string& name, const std::string& value) {
    if (name == "--size-mib") size_mib = std::stoul(value);
    else if (name == "--count") count = std::stoul(value);
    else if (name == "--rounds") rounds = std::stoul(value);
    else return false;
    return true;
  });
  VMMCKPT_CHECK(cuInit(0));
  CUdevice device;
  VMMCKPT_CHECK(cuDeviceGet(&device, 0));
  CUcontext context;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&context, device));
  VMMCKPT_CHECK(cuCtxSetCurrent(context));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // what PyTorch asks for
  std::size_t granularity = 0;
  VMMCKPT_CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const std::size_t size = (size_mib << 20) / granularity * granularity;
  CUdeviceptr base = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&base, size * count, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::vector<double> create_map_access, unmap_release;
  std::vector<CUmemGenericAllocationHandle> handles(count);
  for (std::size_t r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      const auto t = bench::clock_type::now();
      VMMCKPT_CHECK(cuMemCreate(&handles[i], size, &prop, 0));
      VMMCKPT_CHECK(cuMemMap(base + i * size, size, 0, handles[i], 0));
      VMMCKPT_CHECK(cuMemSetAccess(base + i * size, size, &access, 1));
      create_map_access.push_back(bench::seconds_since(t) * 1e6);
    }
    for (std::size_t i = 0; i < count; ++i) {
      const auto t = bench::clock_type::now();
      VMMCKPT_CHECK(cuMemUnmap(base + i * size, size));
      VMMCKPT_CHECK(cuMemRelease(handles[i]));
      unmap_release.push_back(bench::seconds_since(t) * 1e6);
    }
  }
  VMMCKPT_CHECK(cuMemAddressFree(base, size * count));
  std::sort(create_map_access.begin(), create_map_access.end());
  std::sort(unmap_release.begin(), unmap_release.end());
  std::printf("{\"bench\":\"vmm_calls\",\"size_mib\":%zu,\"count\":%zu,\"rounds\":%zu,\"create_map_access_us\":%.2f,"
              "\"create_map_access_p90_us\":%.2f,\"unmap_release_us\":%.2f}\n",
              size >> 20, count, rounds, bench::quantile(create_map_access, 0.5),
              bench::quantile(create_map_access, 0.9), bench::quantile(unmap_release, 0.5));
  return 0;
}
