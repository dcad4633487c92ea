// cuGetProcAddress (v1 and v2): maps a base name and a requested CUDA version to the ABI the real
// driver would hand out. Entry points of the real driver the emulator does not implement resolve
// to traced stubs that answer CUDA_ERROR_NOT_SUPPORTED; names the real driver does not have, or ABI
// versions older than the emulator's (v1 ABIs), are not found.
#include "config.hpp"
#include "emu_api.hpp"

#include <cudaTypedefs.h>

#include <array>
#include <cstring>
#include <string_view>
#include <utility>

// Exported functions defined in other files of the emulator that the table names.
extern "C" {
CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);
CUresult cuGetExportTable(const void**, const CUuuid*);
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode*);
CUresult cuMemAllocAsync(CUdeviceptr*, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool*, CUdevice);
CUresult cuDeviceGetMemPool(CUmemoryPool*, CUdevice);
CUresult cuDeviceSetMemPool(CUdevice, CUmemoryPool);
CUresult cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void*);
CUresult cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute, void*);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemPoolCreate(CUmemoryPool*, const CUmemPoolProps*);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
CUresult cuStreamGetCtx_v2(CUstream, CUcontext*, CUgreenCtx*);
}

namespace {

using vmmckpt::emu::trace;

struct entry {
  const char* name;
  int version;
  void* fn;
};

// The PFN typedef both checks the signature at compile time and names the version the ABI
// appeared in, so a wrong version or a mismatched signature fails to build.
#define E(base, version, symbol) \
  entry { #base, version, reinterpret_cast < void*>(static_cast <PFN_##base##_v##version>(&symbol)) }

const entry implemented[] = {
    E(cuGetErrorString, 6000, cuGetErrorString),
    E(cuGetErrorName, 6000, cuGetErrorName),
    E(cuInit, 2000, cuInit),
    E(cuDriverGetVersion, 2020, cuDriverGetVersion),
    E(cuGetProcAddress, 11030, cuGetProcAddress),
    E(cuGetProcAddress, 12000, cuGetProcAddress_v2),
    E(cuGetExportTable, 3000, cuGetExportTable),
    // Devices.
    E(cuDeviceGet, 2000, cuDeviceGet),
    E(cuDeviceGetCount, 2000, cuDeviceGetCount),
    E(cuDeviceGetName, 2000, cuDeviceGetName),
    E(cuDeviceGetUuid, 9020, cuDeviceGetUuid),
    E(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2),
    E(cuDeviceGetLuid, 10000, cuDeviceGetLuid),
    E(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
    E(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
    E(cuDeviceGetProperties, 2000, cuDeviceGetProperties),
    E(cuDeviceComputeCapability, 2000, cuDeviceComputeCapability),
    E(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId),
    E(cuDeviceGetByPCIBusId, 4010, cuDeviceGetByPCIBusId),
    E(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer),
    E(cuDeviceGetP2PAttribute, 8000, cuDeviceGetP2PAttribute),
    E(cuDeviceGetTexture1DLinearMaxWidth, 11010, cuDeviceGetTexture1DLinearMaxWidth),
    E(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
    E(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool),
    E(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool),
    // Primary contexts: v1 and v2 share one ABI, the emulator gives v2 semantics to both.
    E(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
    E(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease_v2),
    E(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
    E(cuDevicePrimaryCtxSetFlags, 7000, cuDevicePrimaryCtxSetFlags_v2),
    E(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2),
    E(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),
    E(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset_v2),
    E(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
    // Contexts.
    E(cuCtxCreate, 3020, cuCtxCreate_v2),
    E(cuCtxCreate, 12050, cuCtxCreate_v4),
    E(cuCtxDestroy, 4000, cuCtxDestroy_v2),
    E(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
    E(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
    E(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
    E(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
    E(cuCtxGetDevice, 2000, cuCtxGetDevice),
    E(cuCtxGetDevice, 13000, cuCtxGetDevice_v2),
    E(cuCtxGetFlags, 7000, cuCtxGetFlags),
    E(cuCtxSetFlags, 12010, cuCtxSetFlags),
    E(cuCtxGetId, 12000, cuCtxGetId),
    E(cuCtxSynchronize, 2000, cuCtxSynchronize),
    E(cuCtxSynchronize, 13000, cuCtxSynchronize_v2),
    E(cuCtxSetLimit, 3010, cuCtxSetLimit),
    E(cuCtxGetLimit, 3010, cuCtxGetLimit),
    E(cuCtxGetCacheConfig, 3020, cuCtxGetCacheConfig),
    E(cuCtxSetCacheConfig, 3020, cuCtxSetCacheConfig),
    E(cuCtxGetSharedMemConfig, 4020, cuCtxGetSharedMemConfig),
    E(cuCtxSetSharedMemConfig, 4020, cuCtxSetSharedMemConfig),
    E(cuCtxGetApiVersion, 3020, cuCtxGetApiVersion),
    E(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange),
    E(cuCtxResetPersistingL2Cache, 11000, cuCtxResetPersistingL2Cache),
    E(cuCtxEnablePeerAccess, 4000, cuCtxEnablePeerAccess),
    E(cuCtxDisablePeerAccess, 4000, cuCtxDisablePeerAccess),
    E(cuModuleGetLoadingMode, 11070, cuModuleGetLoadingMode),
    // Native memory.
    E(cuMemGetInfo, 3020, cuMemGetInfo_v2),
    E(cuMemAlloc, 3020, cuMemAlloc_v2),
    E(cuMemAllocPitch, 3020, cuMemAllocPitch_v2),
    E(cuMemFree, 3020, cuMemFree_v2),
    E(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2),
    E(cuMemAllocHost, 3020, cuMemAllocHost_v2),
    E(cuMemFreeHost, 2000, cuMemFreeHost),
    E(cuMemHostAlloc, 2020, cuMemHostAlloc),
    E(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2),
    E(cuMemHostGetFlags, 2030, cuMemHostGetFlags),
    E(cuMemHostRegister, 4000, cuMemHostRegister_v2),
    E(cuMemHostRegister, 6050, cuMemHostRegister_v2),
    E(cuMemHostUnregister, 4000, cuMemHostUnregister),
    E(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
    E(cuPointerGetAttributes, 7000, cuPointerGetAttributes),
    E(cuMemAllocAsync, 11020, cuMemAllocAsync),
    E(cuMemFreeAsync, 11020, cuMemFreeAsync),
    E(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute),
    E(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute),
    E(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo),
    E(cuMemPoolCreate, 11020, cuMemPoolCreate),
    E(cuMemPoolDestroy, 11020, cuMemPoolDestroy),
    E(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync),
    // Managed memory and arrays: only the device memory they take (docs/emulator.md).
    E(cuMemAllocManaged, 6000, cuMemAllocManaged),
    E(cuArrayCreate, 3020, cuArrayCreate_v2),
    E(cuArray3DCreate, 3020, cuArray3DCreate_v2),
    E(cuMipmappedArrayCreate, 5000, cuMipmappedArrayCreate),
    E(cuArrayDestroy, 2000, cuArrayDestroy),
    E(cuMipmappedArrayDestroy, 5000, cuMipmappedArrayDestroy),
    // Virtual memory management.
    E(cuMemAddressReserve, 10020, cuMemAddressReserve),
    E(cuMemAddressFree, 10020, cuMemAddressFree),
    E(cuMemCreate, 10020, cuMemCreate),
    E(cuMemRelease, 10020, cuMemRelease),
    E(cuMemMap, 10020, cuMemMap),
    E(cuMemUnmap, 10020, cuMemUnmap),
    E(cuMemSetAccess, 10020, cuMemSetAccess),
    E(cuMemGetAccess, 10020, cuMemGetAccess),
    E(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
    E(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2),
    E(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),
    E(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle),
    E(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle),
    E(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity),
    E(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle),
    E(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle),
    // Copies and memsets.
    E(cuMemcpy, 4000, cuMemcpy),
    E(cuMemcpyAsync, 4000, cuMemcpyAsync),
    E(cuMemcpyPeer, 4000, cuMemcpyPeer),
    E(cuMemcpyPeerAsync, 4000, cuMemcpyPeerAsync),
    E(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),
    E(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
    E(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
    E(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2),
    E(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2),
    E(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2),
    E(cuMemcpy2D, 3020, cuMemcpy2D_v2),
    E(cuMemcpy2DUnaligned, 3020, cuMemcpy2DUnaligned_v2),
    E(cuMemcpy2DAsync, 3020, cuMemcpy2DAsync_v2),
    E(cuMemcpy3D, 3020, cuMemcpy3D_v2),
    E(cuMemcpy3DAsync, 3020, cuMemcpy3DAsync_v2),
    E(cuMemcpy3DPeer, 4000, cuMemcpy3DPeer),
    E(cuMemcpy3DPeerAsync, 4000, cuMemcpy3DPeerAsync),
    E(cuMemsetD8, 3020, cuMemsetD8_v2),
    E(cuMemsetD16, 3020, cuMemsetD16_v2),
    E(cuMemsetD32, 3020, cuMemsetD32_v2),
    E(cuMemsetD2D8, 3020, cuMemsetD2D8_v2),
    E(cuMemsetD2D16, 3020, cuMemsetD2D16_v2),
    E(cuMemsetD2D32, 3020, cuMemsetD2D32_v2),
    E(cuMemsetD8Async, 3020, cuMemsetD8Async),
    E(cuMemsetD16Async, 3020, cuMemsetD16Async),
    E(cuMemsetD32Async, 3020, cuMemsetD32Async),
    E(cuMemsetD2D8Async, 3020, cuMemsetD2D8Async),
    E(cuMemsetD2D16Async, 3020, cuMemsetD2D16Async),
    E(cuMemsetD2D32Async, 3020, cuMemsetD2D32Async),
    // Streams, events, host functions.
    E(cuStreamCreate, 2000, cuStreamCreate),
    E(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority),
    E(cuStreamDestroy, 2000, cuStreamDestroy_v2),
    E(cuStreamDestroy, 4000, cuStreamDestroy_v2),
    E(cuStreamSynchronize, 2000, cuStreamSynchronize),
    E(cuStreamQuery, 2000, cuStreamQuery),
    E(cuStreamWaitEvent, 3020, cuStreamWaitEvent),
    E(cuStreamGetCtx, 9020, cuStreamGetCtx),
    E(cuStreamGetCtx, 12050, cuStreamGetCtx_v2),
    E(cuStreamGetDevice, 12080, cuStreamGetDevice),
    E(cuStreamGetFlags, 5050, cuStreamGetFlags),
    E(cuStreamGetPriority, 5050, cuStreamGetPriority),
    E(cuStreamGetId, 12000, cuStreamGetId),
    E(cuStreamAddCallback, 5000, cuStreamAddCallback),
    E(cuLaunchHostFunc, 10000, cuLaunchHostFunc),
    E(cuEventCreate, 2000, cuEventCreate),
    E(cuEventDestroy, 2000, cuEventDestroy_v2),
    E(cuEventDestroy, 4000, cuEventDestroy_v2),
    E(cuEventRecord, 2000, cuEventRecord),
    E(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags),
    E(cuEventQuery, 2000, cuEventQuery),
    E(cuEventSynchronize, 2000, cuEventSynchronize),
    E(cuEventElapsedTime, 2000, cuEventElapsedTime),
    E(cuEventElapsedTime, 12080, cuEventElapsedTime_v2),
    // Driver checkpoint API: present, answers CUDA_ERROR_NOT_SUPPORTED.
    E(cuCheckpointProcessGetRestoreThreadId, 12080, cuCheckpointProcessGetRestoreThreadId),
    E(cuCheckpointProcessGetState, 12080, cuCheckpointProcessGetState),
    E(cuCheckpointProcessLock, 12080, cuCheckpointProcessLock),
    E(cuCheckpointProcessCheckpoint, 12080, cuCheckpointProcessCheckpoint),
    E(cuCheckpointProcessRestore, 12080, cuCheckpointProcessRestore),
    E(cuCheckpointProcessUnlock, 12080, cuCheckpointProcessUnlock),
};
#undef E

struct known_symbol {
  const char* name;
  int version;
};

// Every entry point and ABI version of the real driver, generated from cudaTypedefs.h.
constexpr known_symbol known[] = {
#define VMMCKPT_KNOWN(base, version) {#base, version},
#include "known_symbols.inc"
#undef VMMCKPT_KNOWN
};
constexpr std::size_t known_count = sizeof known / sizeof known[0];

// A distinct stub per known name, so the trace can say which unimplemented function was called.
// Called through a pointer of another signature: harmless on the SysV ABI, where the caller owns
// its arguments and the stub reads none of them.
template <std::size_t I>
CUresult unimplemented_stub() {
  trace("call to unimplemented %s: CUDA_ERROR_NOT_SUPPORTED", known[I].name);
  return CUDA_ERROR_NOT_SUPPORTED;
}

template <std::size_t... I>
std::array<CUresult (*)(), sizeof...(I)> make_stubs(std::index_sequence<I...>) {
  return {&unimplemented_stub<I>...};
}

const auto stubs = make_stubs(std::make_index_sequence<known_count>{});

// The real driver's ABIs of a name: the newest within the requested version (best_version -1: none), and the
// oldest (-1: the name is unknown).
struct known_abis {
  int best_version = -1;
  std::size_t best_index = 0;
  int oldest_version = -1;
};

known_abis known_abis_of(std::string_view name, int cuda_version) {
  known_abis k;
  for (std::size_t i = 0; i < known_count; ++i) {
    if (name != known[i].name) continue;
    if (k.oldest_version < 0 || known[i].version < k.oldest_version) k.oldest_version = known[i].version;
    if (known[i].version <= cuda_version && known[i].version > k.best_version) {
      k.best_version = known[i].version;
      k.best_index = i;
    }
  }
  return k;
}

// The emulator's newest implementation of a name within the requested version (null: none); `any`: whether
// it implements the name at all.
const entry* implementation_of(std::string_view name, int cuda_version, bool& any) {
  const entry* best = nullptr;
  any = false;
  for (const auto& e : implemented) {
    if (name != e.name) continue;
    any = true;
    if (e.version <= cuda_version && (best == nullptr || e.version > best->version)) best = &e;
  }
  return best;
}

// A lookup's answer: the function into *pfn, the status into *status when asked for.
CUresult answer(void** pfn, CUdriverProcAddressQueryResult* status, CUresult rc, CUdriverProcAddressQueryResult s,
                void* fn) {
  *pfn = fn;
  if (status == nullptr) return rc;
  *status = s;
  // Driver 580 answers a failed lookup with CUDA_SUCCESS when the caller
  // asked for the status: the status carries the outcome (seen on an H100).
  return rc == CUDA_ERROR_NOT_FOUND ? CUDA_SUCCESS : rc;
}

CUresult lookup(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t valid_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~valid_flags) != 0)
    return answer(pfn, status, CUDA_ERROR_INVALID_VALUE, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, nullptr);
  const std::string_view name(symbol);
  const known_abis k = known_abis_of(name, cuda_version);
  bool any_implemented = false;
  const entry* best = implementation_of(name, cuda_version, any_implemented);

  if (best != nullptr && best->version >= k.best_version)
    return answer(pfn, status, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS, best->fn);
  if (k.best_version < 0 && k.oldest_version >= 0) {
    trace("cuGetProcAddress(%s, %d): version not sufficient (first ABI %d)", symbol, cuda_version, k.oldest_version);
    return answer(pfn, status, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, nullptr);
  }
  if (k.best_version >= 0 && !any_implemented) {
    // A real entry point the emulator lacks: callers get a function that says so when called.
    trace("cuGetProcAddress(%s, %d): not emulated, returning a NOT_SUPPORTED stub", symbol, cuda_version);
    return answer(pfn, status, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS, reinterpret_cast<void*>(stubs[k.best_index]));
  }
  // Unknown name, or an ABI version the emulator does not implement (v1 ABIs).
  trace("cuGetProcAddress(%s, %d): not found", symbol, cuda_version);
  return answer(pfn, status, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, nullptr);
}

}  // namespace

extern "C" {

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  return vmmckpt::emu::guarded([&] { return lookup(symbol, pfn, cudaVersion, flags, symbolStatus); });
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return vmmckpt::emu::guarded([&] { return lookup(symbol, pfn, cudaVersion, flags, nullptr); });
}

}  // extern "C"
