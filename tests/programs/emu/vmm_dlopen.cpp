// Emulator test program: the VMM API found on a libcuda handle the program opens itself, as XLA's stub
// table does (dlsym on that handle) and as cudart and NCCL do (cuGetProcAddress). No libcuda at link time.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

using vmmckpt::contracts::print_ptr;

namespace {

void* lib = nullptr;
PFN_cuGetProcAddress_v12000 get_proc = nullptr;
int mismatches = 0;

// The function on the handle, checked to be the shim's and to be what cuGetProcAddress gives.
template <typename Fn>
Fn find(const char* name, int version) {
  void* on_handle = dlsym(lib, name);
  void* resolved = nullptr;
  CUdriverProcAddressQueryResult status{};
  const CUresult e = get_proc(name, &resolved, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  Dl_info where{};
  const bool in_shim = on_handle != nullptr && dladdr(on_handle, &where) != 0 && where.dli_fname != nullptr &&
                       std::strstr(where.dli_fname, "libvmmckpt") != nullptr;
  if (!in_shim || e != CUDA_SUCCESS || resolved != on_handle) {
    std::printf("MISMATCH %s: dlsym %p (%s), cuGetProcAddress %p\n", name, on_handle,
                where.dli_fname ? where.dli_fname : "?", resolved);
    ++mismatches;
  }
  return reinterpret_cast<Fn>(on_handle);
}

}  // namespace

int main() {
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  VMMCKPT_EXPECT(lib != nullptr);
  get_proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(lib, "cuGetProcAddress_v2"));
  VMMCKPT_EXPECT(get_proc != nullptr);

  const auto init = reinterpret_cast<PFN_cuInit_v2000>(dlsym(lib, "cuInit"));
  const auto ctx_retain = reinterpret_cast<PFN_cuDevicePrimaryCtxRetain_v7000>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
  const auto ctx_set = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(dlsym(lib, "cuCtxSetCurrent"));
  VMMCKPT_EXPECT(init && ctx_retain && ctx_set);
  VMMCKPT_EXPECT(init(0) == CUDA_SUCCESS);
  CUcontext ctx;
  VMMCKPT_EXPECT(ctx_retain(&ctx, 0) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(ctx_set(ctx) == CUDA_SUCCESS);

  const auto reserve = find<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve", 12000);
  const auto address_free = find<PFN_cuMemAddressFree_v10020>("cuMemAddressFree", 12000);
  const auto create = find<PFN_cuMemCreate_v10020>("cuMemCreate", 12000);
  const auto release = find<PFN_cuMemRelease_v10020>("cuMemRelease", 12000);
  const auto map = find<PFN_cuMemMap_v10020>("cuMemMap", 12000);
  const auto unmap = find<PFN_cuMemUnmap_v10020>("cuMemUnmap", 12000);
  const auto set_access = find<PFN_cuMemSetAccess_v10020>("cuMemSetAccess", 12000);
  const auto get_access = find<PFN_cuMemGetAccess_v10020>("cuMemGetAccess", 12000);
  const auto retain = find<PFN_cuMemRetainAllocationHandle_v11000>("cuMemRetainAllocationHandle", 12000);
  const auto properties =
      find<PFN_cuMemGetAllocationPropertiesFromHandle_v10020>("cuMemGetAllocationPropertiesFromHandle", 12000);
  find<PFN_cuMemExportToShareableHandle_v10020>("cuMemExportToShareableHandle", 12000);
  find<PFN_cuMemImportFromShareableHandle_v10020>("cuMemImportFromShareableHandle", 12000);
  const auto granularity = find<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity", 12000);
  const auto attribute = find<PFN_cuDeviceGetAttribute_v2000>("cuDeviceGetAttribute", 12000);
  VMMCKPT_EXPECT(mismatches == 0);

  // XLA's kVmm allocator: alignment max(granularity, requested), access for the device, an offset map.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  VMMCKPT_EXPECT(granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
  const size_t size = 8 * gran;
  const size_t alignment = gran > (16u << 20) ? gran : (16u << 20);
  CUdeviceptr va = 0;
  VMMCKPT_EXPECT(reserve(&va, size, alignment, 0, 0) == CUDA_SUCCESS);
  print_ptr(va, size, "dlsym-cuMemAddressReserve");
  VMMCKPT_EXPECT(va % alignment == 0);
  CUmemGenericAllocationHandle h = 0;
  VMMCKPT_EXPECT(create(&h, 2 * size, &prop, 0) == CUDA_SUCCESS);
  std::printf("token 0x%llx dlsym-cuMemCreate\n", static_cast<unsigned long long>(h));
  VMMCKPT_EXPECT(map(va, size, size, h, 0) == CUDA_SUCCESS);  // the handle's second half
  CUmemAccessDesc rw{};
  rw.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  rw.location.id = 0;
  rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  VMMCKPT_EXPECT(set_access(va, size, &rw, 1) == CUDA_SUCCESS);
  unsigned long long flags = 0;
  VMMCKPT_EXPECT(get_access(&flags, &rw.location, va) == CUDA_SUCCESS && flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  void* memset_p = nullptr;
  CUdriverProcAddressQueryResult memset_status{};
  VMMCKPT_EXPECT(get_proc("cuMemsetD8", &memset_p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &memset_status) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(reinterpret_cast<PFN_cuMemsetD8_v3020>(memset_p)(va, 0x5a, size) == CUDA_SUCCESS);
  CUmemGenericAllocationHandle again = 0;
  VMMCKPT_EXPECT(retain(&again, reinterpret_cast<void*>(va + size - 1)) == CUDA_SUCCESS && again == h);
  VMMCKPT_EXPECT(release(again) == CUDA_SUCCESS);
  CUmemAllocationProp got{};
  VMMCKPT_EXPECT(properties(&got, h) == CUDA_SUCCESS && got.requestedHandleTypes == prop.requestedHandleTypes);

  // Multicast is off: the device says so, and creating one is refused without reaching the driver.
  int multicast = -1;
  VMMCKPT_EXPECT(attribute(&multicast, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(multicast == 0);
  void* mc = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (get_proc("cuMulticastCreate", &mc, 12010, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS && mc) {
    Dl_info where{};
    VMMCKPT_EXPECT(dladdr(mc, &where) != 0 && where.dli_fname != nullptr &&
                   std::strstr(where.dli_fname, "libvmmckpt") != nullptr);
    CUmulticastObjectProp mc_prop{};
    mc_prop.numDevices = 1;
    mc_prop.size = size;
    mc_prop.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle mc_handle = 0;
    const CUresult e = reinterpret_cast<PFN_cuMulticastCreate_v12010>(mc)(&mc_handle, &mc_prop);
    std::printf("multicast %d\n", static_cast<int>(e));
    VMMCKPT_EXPECT(e == CUDA_ERROR_NOT_SUPPORTED);
  }

  VMMCKPT_EXPECT(unmap(va, size) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(release(h) == CUDA_SUCCESS);
  VMMCKPT_EXPECT(address_free(va, size) == CUDA_SUCCESS);
  std::printf("done, mismatches %d\n", mismatches);
  return mismatches == 0 ? 0 : 1;
}
