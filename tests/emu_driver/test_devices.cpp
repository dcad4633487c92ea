// Tests of initialisation, device queries, contexts and the environment-driven device setup.
#include "emu_test_support.hpp"

#include <dirent.h>

#include <cstring>
#include <string>
#include <thread>

using namespace emu_test;

namespace {

int thread_count() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

}  // namespace

// Runs alone in a fresh process (its own ctest entry): it checks the state before cuInit.
TEST_CASE("calls before cuInit and without a context fail like the real driver", "[.fresh]") {
  int count = -1;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_ERROR_NOT_INITIALIZED);
  int version = 0;
  REQUIRE_CU(cuDriverGetVersion(&version));  // allowed before cuInit
  REQUIRE(version == 13000);

  REQUIRE(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(cuInit(0));
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(cuCtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT);
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, 0) == CUDA_ERROR_INVALID_CONTEXT);

  // No thread exists until a stream is used: synchronous work runs on the caller's thread.
  const int before = thread_count();
  current_context();
  REQUIRE_CU(cuMemAlloc(&p, 4096));
  char buf[16] = "abc";
  REQUIRE_CU(cuMemcpyHtoD(p, buf, sizeof buf));
  REQUIRE_CU(cuMemsetD8(p, 1, 16));
  REQUIRE_CU(cuCtxSynchronize());
  REQUIRE(thread_count() == before);
  int flag = 0;
  REQUIRE_CU(cuLaunchHostFunc(
      nullptr, [](void* f) { *static_cast<int*>(f) = 1; }, &flag));
  REQUIRE_CU(cuCtxSynchronize());
  REQUIRE(flag == 1);
  REQUIRE(thread_count() == before + 1);
  REQUIRE_CU(cuMemFree(p));
}

TEST_CASE("device queries describe a Hopper-like device", "[devices]") {
  current_context();
  int count = 0;
  REQUIRE_CU(cuDeviceGetCount(&count));
  REQUIRE(count >= 1);
  CUdevice dev = -1;
  REQUIRE_CU(cuDeviceGet(&dev, 0));
  REQUIRE(dev == 0);
  REQUIRE(cuDeviceGet(&dev, count) == CUDA_ERROR_INVALID_DEVICE);

  char name[64] = {};
  REQUIRE_CU(cuDeviceGetName(name, sizeof name, 0));
  REQUIRE(std::string(name) == "vmmckpt emulated device");

  auto attr = [](CUdevice_attribute a) {
    int v = -1;
    REQUIRE_CU(cuDeviceGetAttribute(&v, a, 0));
    return v;
  };
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) == 0);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) == 132);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE) == 32);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) == 1);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 1);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) == 1);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT) == 512);
  REQUIRE(attr(CU_DEVICE_ATTRIBUTE_ECC_ENABLED) == 1);
  int v = 0;
  REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0) == CUDA_ERROR_INVALID_VALUE);

  CUuuid a{}, b{};
  REQUIRE_CU(cuDeviceGetUuid(&a, 0));
  REQUIRE_CU(cuDeviceGetUuid_v2(&b, 0));
  REQUIRE(std::memcmp(a.bytes, b.bytes, sizeof a.bytes) == 0);

  std::size_t total = 0;
  REQUIRE_CU(cuDeviceTotalMem(&total, 0));
  REQUIRE(total > 0);
  char bus[32] = {};
  REQUIRE_CU(cuDeviceGetPCIBusId(bus, sizeof bus, 0));
  CUdevice back = -1;
  REQUIRE_CU(cuDeviceGetByPCIBusId(&back, bus));
  REQUIRE(back == 0);
}

TEST_CASE("primary context and the thread's context stack", "[contexts]") {
  CUcontext primary = current_context();
  CUcontext cur = nullptr;
  REQUIRE_CU(cuCtxGetCurrent(&cur));
  REQUIRE(cur == primary);
  CUdevice dev = -1;
  REQUIRE_CU(cuCtxGetDevice(&dev));
  REQUIRE(dev == 0);
  REQUIRE_CU(cuCtxGetDevice_v2(&dev, primary));
  unsigned flags = 99;
  int active = 0;
  REQUIRE_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  REQUIRE(active == 1);
  unsigned api = 0;
  REQUIRE_CU(cuCtxGetApiVersion(primary, &api));
  REQUIRE_CU(cuCtxGetFlags(&flags));
  REQUIRE_CU(cuCtxSynchronize_v2(primary));

  // The current context is per thread.
  CUresult get_rc = CUDA_ERROR_UNKNOWN, alloc_rc = CUDA_SUCCESS;
  CUcontext seen = reinterpret_cast<CUcontext>(1);
  std::thread([&] {
    get_rc = cuCtxGetCurrent(&seen);
    CUdeviceptr p = 0;
    alloc_rc = cuMemAlloc(&p, 16);
  }).join();
  REQUIRE(get_rc == CUDA_SUCCESS);
  REQUIRE(seen == nullptr);
  REQUIRE(alloc_rc == CUDA_ERROR_INVALID_CONTEXT);

  // Push/pop, and a user context.
  CUcontext user = nullptr;
  REQUIRE_CU(cuCtxCreate(&user, nullptr, 0, 0));
  REQUIRE_CU(cuCtxGetCurrent(&cur));
  REQUIRE(cur == user);
  CUcontext popped = nullptr;
  REQUIRE_CU(cuCtxPopCurrent(&popped));
  REQUIRE(popped == user);
  REQUIRE_CU(cuCtxGetCurrent(&cur));
  REQUIRE(cur == primary);
  REQUIRE_CU(cuCtxPushCurrent(user));
  REQUIRE_CU(cuCtxDestroy(user));
  REQUIRE_CU(cuCtxGetCurrent(&cur));
  REQUIRE(cur == primary);
  REQUIRE(cuCtxSetCurrent(user) == CUDA_ERROR_INVALID_CONTEXT);

  // Retain/release are counted: one extra retain, one release, still active.
  CUcontext again = nullptr;
  REQUIRE_CU(cuDevicePrimaryCtxRetain(&again, 0));
  REQUIRE(again == primary);
  REQUIRE_CU(cuDevicePrimaryCtxRelease(0));
  REQUIRE_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  REQUIRE(active == 1);
}

// Its own ctest entry with VMMCKPT_EMU_DEVICES=2.
TEST_CASE("two devices with VMMCKPT_EMU_DEVICES=2", "[.two_devices]") {
  REQUIRE_CU(cuInit(0));
  int count = 0;
  REQUIRE_CU(cuDeviceGetCount(&count));
  REQUIRE(count == 2);
  CUuuid u0{}, u1{};
  REQUIRE_CU(cuDeviceGetUuid(&u0, 0));
  REQUIRE_CU(cuDeviceGetUuid(&u1, 1));
  REQUIRE(std::memcmp(u0.bytes, u1.bytes, sizeof u0.bytes) != 0);

  CUcontext c1 = nullptr;
  REQUIRE_CU(cuDevicePrimaryCtxRetain(&c1, 1));
  REQUIRE_CU(cuCtxSetCurrent(c1));
  CUdevice dev = -1;
  REQUIRE_CU(cuCtxGetDevice(&dev));
  REQUIRE(dev == 1);

  // Physical memory on device 1, mapped and accessible from device 1.
  CUmemAllocationProp prop = exportable_prop(1);
  CUmemGenericAllocationHandle h = 0;
  REQUIRE_CU(cuMemCreate(&h, granularity, &prop, 0));
  CUmemAllocationProp back{};
  REQUIRE_CU(cuMemGetAllocationPropertiesFromHandle(&back, h));
  REQUIRE(back.location.id == 1);
  CUdeviceptr va = 0;
  REQUIRE_CU(cuMemAddressReserve(&va, granularity, 0, 0, 0));
  REQUIRE_CU(cuMemMap(va, granularity, 0, h, 0));
  CUmemAccessDesc desc = read_write(1);
  REQUIRE_CU(cuMemSetAccess(va, granularity, &desc, 1));
  unsigned long long flags = 0;
  CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 1};
  REQUIRE_CU(cuMemGetAccess(&flags, &loc, va));
  REQUIRE(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  loc.id = 0;
  REQUIRE_CU(cuMemGetAccess(&flags, &loc, va));
  REQUIRE(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  REQUIRE_CU(cuMemsetD32(va, 0xabcd, 16));
  REQUIRE(reinterpret_cast<unsigned*>(va)[15] == 0xabcd);

  // Memory accounting is per device.
  std::size_t free1 = 0, total1 = 0, free0 = 0, total0 = 0;
  REQUIRE_CU(cuMemGetInfo(&free1, &total1));
  CUcontext c0 = nullptr;
  REQUIRE_CU(cuDevicePrimaryCtxRetain(&c0, 0));
  REQUIRE_CU(cuCtxSetCurrent(c0));
  REQUIRE_CU(cuMemGetInfo(&free0, &total0));
  REQUIRE(total1 - free1 == granularity);
  REQUIRE(total0 - free0 == 0);

  REQUIRE_CU(cuMemUnmap(va, granularity));
  REQUIRE_CU(cuMemRelease(h));
  REQUIRE_CU(cuMemAddressFree(va, granularity));
  int n = 0;
  REQUIRE(cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 2) == CUDA_ERROR_INVALID_DEVICE);
}
