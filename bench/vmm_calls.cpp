// What the shim costs a program that maps VMM memory itself, as PyTorch's expandable segments grow,
// measured inside one process so that the machine's drift cancels out: rounds through the entry points
// the program links (under the shim, its own) alternate with rounds through the driver's own functions
// (looked up in libcuda itself, past any interposer). Natively the two are the same functions, so a
// native run is the control: its difference shows what the method cannot resolve.
//
//   vmmckpt_bench_vmm_calls [--size-mib 20] [--count 64] [--rounds 40]
//
// Each side has a reservation of count × size of its own. A round creates `count` handles of `size`,
// maps each at its place and gives it access (cuMemCreate + cuMemMap + cuMemSetAccess, timed per
// handle: the figure compared), then unmaps and releases them (timed apart). One JSON line (us per
// handle, medians over every handle of the side's rounds):
//   {"bench":"vmm_calls","size_mib":..,"count":..,"rounds":..,"same_function":bool,
//    "handed_us":..,"driver_us":..,"ratio":handed/driver,"handed_unmap_release_us":..,"driver_unmap_release_us":..}
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_util.hpp"

namespace {

struct vmm_api {
  decltype(&cuMemAddressReserve) reserve;
  decltype(&cuMemAddressFree) free;
  decltype(&cuMemCreate) create;
  decltype(&cuMemRelease) release;
  decltype(&cuMemMap) map;
  decltype(&cuMemUnmap) unmap;
  decltype(&cuMemSetAccess) set_access;
};

vmm_api handed() {
  return {&cuMemAddressReserve, &cuMemAddressFree, &cuMemCreate, &cuMemRelease, &cuMemMap,
          &cuMemUnmap,          &cuMemSetAccess};
}

template <typename F>
F own(const char* name) {
  void* p = bench::driver_own(name);
  if (p == nullptr) bench::usage_error("vmmckpt_bench_vmm_calls", std::string("the driver has no ") + name);
  return reinterpret_cast<F>(p);
}

vmm_api driver() {
  return {own<decltype(&cuMemAddressReserve)>("cuMemAddressReserve"),
          own<decltype(&cuMemAddressFree)>("cuMemAddressFree"),
          own<decltype(&cuMemCreate)>("cuMemCreate"),
          own<decltype(&cuMemRelease)>("cuMemRelease"),
          own<decltype(&cuMemMap)>("cuMemMap"),
          own<decltype(&cuMemUnmap)>("cuMemUnmap"),
          own<decltype(&cuMemSetAccess)>("cuMemSetAccess")};
}

struct side {
  vmm_api api;
  CUdeviceptr base = 0;
  std::vector<double> grow_us, shrink_us;
};

void round(side& s, const CUmemAllocationProp& prop, const CUmemAccessDesc& access, std::size_t size,
           std::size_t count) {
  std::vector<CUmemGenericAllocationHandle> handles(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto t = bench::clock_type::now();
    VMMCKPT_CHECK(s.api.create(&handles[i], size, &prop, 0));
    VMMCKPT_CHECK(s.api.map(s.base + i * size, size, 0, handles[i], 0));
    VMMCKPT_CHECK(s.api.set_access(s.base + i * size, size, &access, 1));
    s.grow_us.push_back(bench::seconds_since(t) * 1e6);
  }
  for (std::size_t i = 0; i < count; ++i) {
    const auto t = bench::clock_type::now();
    VMMCKPT_CHECK(s.api.unmap(s.base + i * size, size));
    VMMCKPT_CHECK(s.api.release(handles[i]));
    s.shrink_us.push_back(bench::seconds_since(t) * 1e6);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return bench::quantile(v, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t size_mib = 20, count = 64, rounds = 40;
  bench::parse_options(argc, argv, [&](const std::string& name, const std::string& value) {
    if (name == "--size-mib")
      size_mib = std::stoul(value);
    else if (name == "--count")
      count = std::stoul(value);
    else if (name == "--rounds")
      rounds = std::stoul(value);
    else
      return false;
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
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  side sides[2] = {side{handed(), 0, {}, {}}, side{driver(), 0, {}, {}}};
  for (side& s : sides) VMMCKPT_CHECK(s.api.reserve(&s.base, size * count, 0, 0, 0));
  for (std::size_t r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < 2; ++k) round(sides[(r + k) % 2], prop, access, size, count);  // order alternates
  for (side& s : sides) VMMCKPT_CHECK(s.api.free(s.base, size * count));

  const double handed_us = median(sides[0].grow_us), driver_us = median(sides[1].grow_us);
  std::printf("{\"bench\":\"vmm_calls\",\"size_mib\":%zu,\"count\":%zu,\"rounds\":%zu,\"same_function\":%s,"
              "\"handed_us\":%.2f,\"driver_us\":%.2f,\"ratio\":%.4f,\"handed_unmap_release_us\":%.2f,"
              "\"driver_unmap_release_us\":%.2f}\n",
              size >> 20, count, rounds, sides[0].api.create == sides[1].api.create ? "true" : "false", handed_us,
              driver_us, handed_us / driver_us, median(sides[0].shrink_us), median(sides[1].shrink_us));
  return 0;
}
