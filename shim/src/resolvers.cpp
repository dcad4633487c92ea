// The resolver doors: dlsym, cuGetProcAddress and cudaGetDriverEntryPoint hand out the shim's functions.
//
// Static cudart (nvcc's default), NCCL and PyTorch never call cuMemAlloc by
// name: they dlopen libcuda, dlsym cuGetProcAddress, and ask it for every entry
// point. Each resolver calls the real one first and substitutes only on
// success, only for names and ABI versions the shim implements.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstring>
#include <string_view>

#include "entry_points.hpp"
#include "gated_entry_points.hpp"

#undef cuGetProcAddress  // cuda.h renames it to _v2; the v1 ABI is exported too
// cudaGetDriverEntryPoint is deprecated, and still called by programs: we serve it.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

extern "C" {
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** dev_ptr, size_t size, cudaStream_t stream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* dev_ptr, cudaStream_t stream);
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags);
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** func, unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* status);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** func, unsigned int version,
                                                            unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* status);
}

namespace vmmckpt::detail {
namespace {

// A driver entry point by its cuGetProcAddress name: the ABI introduced in
// `since` (a CUDA version) is the one we implement, until the next row's.
struct driver_substitute {
  std::string_view name;
  int since;
  void* legacy;
  void* per_thread;  // the _ptsz twin where the stream semantics differ
};

#define VMMCKPT_FN(f) reinterpret_cast<void*>(&f)
const driver_substitute driver_substitutes[] = {
    {"cuMemAlloc", 3020, VMMCKPT_FN(cuMemAlloc_v2), nullptr},
    {"cuMemAllocPitch", 3020, VMMCKPT_FN(cuMemAllocPitch_v2), nullptr},
    {"cuMemFree", 3020, VMMCKPT_FN(cuMemFree_v2), nullptr},
    {"cuMemGetInfo", 3020, VMMCKPT_FN(cuMemGetInfo_v2), nullptr},
    {"cuMemGetAddressRange", 3020, VMMCKPT_FN(cuMemGetAddressRange_v2), nullptr},
    {"cuPointerGetAttribute", 4000, VMMCKPT_FN(cuPointerGetAttribute), nullptr},
    {"cuPointerGetAttributes", 7000, VMMCKPT_FN(cuPointerGetAttributes), nullptr},
    {"cuMemAllocAsync", 11020, VMMCKPT_FN(cuMemAllocAsync), VMMCKPT_FN(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, VMMCKPT_FN(cuMemFreeAsync), VMMCKPT_FN(cuMemFreeAsync_ptsz)},
    {"cuGetProcAddress", 11030, VMMCKPT_FN(cuGetProcAddress), nullptr},
    {"cuGetProcAddress", 12000, VMMCKPT_FN(cuGetProcAddress_v2), nullptr},
    {"cuMemAllocManaged", 6000, VMMCKPT_FN(cuMemAllocManaged), nullptr},
    {"cuMemCreate", 10020, VMMCKPT_FN(cuMemCreate), nullptr},
    {"cuMemPoolCreate", 11020, VMMCKPT_FN(cuMemPoolCreate), nullptr},
    {"cuMemAllocFromPoolAsync", 11020, VMMCKPT_FN(cuMemAllocFromPoolAsync), VMMCKPT_FN(cuMemAllocFromPoolAsync_ptsz)},
    {"cuArrayCreate", 3020, VMMCKPT_FN(cuArrayCreate_v2), nullptr},
    {"cuArray3DCreate", 3020, VMMCKPT_FN(cuArray3DCreate_v2), nullptr},
    {"cuMipmappedArrayCreate", 5000, VMMCKPT_FN(cuMipmappedArrayCreate), nullptr},
};

// Exact exported names, for dlsym.
struct symbol_substitute {
  std::string_view name;
  void* ours;
};
const symbol_substitute symbol_substitutes[] = {
    {"cuMemAlloc_v2", VMMCKPT_FN(cuMemAlloc_v2)},
    {"cuMemAllocPitch_v2", VMMCKPT_FN(cuMemAllocPitch_v2)},
    {"cuMemFree_v2", VMMCKPT_FN(cuMemFree_v2)},
    {"cuMemGetInfo_v2", VMMCKPT_FN(cuMemGetInfo_v2)},
    {"cuMemGetAddressRange_v2", VMMCKPT_FN(cuMemGetAddressRange_v2)},
    {"cuPointerGetAttribute", VMMCKPT_FN(cuPointerGetAttribute)},
    {"cuPointerGetAttributes", VMMCKPT_FN(cuPointerGetAttributes)},
    {"cuMemAllocAsync", VMMCKPT_FN(cuMemAllocAsync)},
    {"cuMemAllocAsync_ptsz", VMMCKPT_FN(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", VMMCKPT_FN(cuMemFreeAsync)},
    {"cuMemFreeAsync_ptsz", VMMCKPT_FN(cuMemFreeAsync_ptsz)},
    {"cuGetProcAddress", VMMCKPT_FN(cuGetProcAddress)},
    {"cuGetProcAddress_v2", VMMCKPT_FN(cuGetProcAddress_v2)},
    {"cuMemAllocManaged", VMMCKPT_FN(cuMemAllocManaged)},
    {"cuMemCreate", VMMCKPT_FN(cuMemCreate)},
    {"cuMemPoolCreate", VMMCKPT_FN(cuMemPoolCreate)},
    {"cuMemAllocFromPoolAsync", VMMCKPT_FN(cuMemAllocFromPoolAsync)},
    {"cuMemAllocFromPoolAsync_ptsz", VMMCKPT_FN(cuMemAllocFromPoolAsync_ptsz)},
    {"cuArrayCreate_v2", VMMCKPT_FN(cuArrayCreate_v2)},
    {"cuArray3DCreate_v2", VMMCKPT_FN(cuArray3DCreate_v2)},
    {"cuMipmappedArrayCreate", VMMCKPT_FN(cuMipmappedArrayCreate)},
    {"cudaMalloc", VMMCKPT_FN(cudaMalloc)},
    {"cudaMallocPitch", VMMCKPT_FN(cudaMallocPitch)},
    {"cudaMallocAsync", VMMCKPT_FN(cudaMallocAsync)},
    {"cudaMallocAsync_ptsz", VMMCKPT_FN(cudaMallocAsync_ptsz)},
    {"cudaFree", VMMCKPT_FN(cudaFree)},
    {"cudaFreeAsync", VMMCKPT_FN(cudaFreeAsync)},
    {"cudaFreeAsync_ptsz", VMMCKPT_FN(cudaFreeAsync_ptsz)},
    {"cudaMemGetInfo", VMMCKPT_FN(cudaMemGetInfo)},
    {"cudaGetDriverEntryPoint", VMMCKPT_FN(cudaGetDriverEntryPoint)},
    {"cudaGetDriverEntryPoint_ptsz", VMMCKPT_FN(cudaGetDriverEntryPoint_ptsz)},
    {"cudaGetDriverEntryPointByVersion", VMMCKPT_FN(cudaGetDriverEntryPointByVersion)},
    {"cudaGetDriverEntryPointByVersion_ptsz", VMMCKPT_FN(cudaGetDriverEntryPointByVersion_ptsz)},
};
#undef VMMCKPT_FN

// The shim's function for a cuGetProcAddress-style request, or null.
void* driver_substitute_for(const char* symbol, int cuda_version, cuuint64_t flags, void* real) {
  if (symbol == nullptr || real == nullptr || !shim_active()) return nullptr;
  const std::string_view name(symbol);
  const driver_substitute* best = nullptr;
  for (const auto& s : driver_substitutes)
    if (s.name == name && s.since <= cuda_version && (best == nullptr || s.since > best->since)) best = &s;
  if (best == nullptr) {
    void* gated = gated_substitute_for_pointer(real);
    if (gated != nullptr) log::debug("resolver: {} (CUDA {}) passes the gate", symbol, cuda_version);
    return gated;
  }
  void* ours = best->legacy;
  if (best->per_thread != nullptr) {
    // Match the stream semantics the driver chose: compare with its _ptsz twin.
    const driver_api* d = driver();
    const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ||
                            (d != nullptr && ((name == "cuMemAllocAsync" && real == reinterpret_cast<void*>(d->cuMemAllocAsync_ptsz)) ||
                                              (name == "cuMemFreeAsync" && real == reinterpret_cast<void*>(d->cuMemFreeAsync_ptsz)) ||
                                              (name == "cuMemAllocFromPoolAsync" &&
                                               real == reinterpret_cast<void*>(d->cuMemAllocFromPoolAsync_ptsz))));
    if (per_thread) ours = best->per_thread;
  }
  if (ours != real) log::debug("resolver: {} (CUDA {}) served by the pool", symbol, cuda_version);
  return ours;
}

runtime_symbol real_cudaGetDriverEntryPoint{"cudaGetDriverEntryPoint"};
runtime_symbol real_cudaGetDriverEntryPoint_ptsz{"cudaGetDriverEntryPoint_ptsz"};
runtime_symbol real_cudaGetDriverEntryPointByVersion{"cudaGetDriverEntryPointByVersion"};
runtime_symbol real_cudaGetDriverEntryPointByVersion_ptsz{"cudaGetDriverEntryPointByVersion_ptsz"};
runtime_symbol real_cudaRuntimeGetVersion{"cudaRuntimeGetVersion"};

int runtime_version() {
  int version = CUDA_VERSION;
  if (auto fn = real_cudaRuntimeGetVersion.get<cudaError_t (*)(int*)>()) fn(&version);
  return version;
}

using entry_point_fn = cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*);
using entry_point_by_version_fn = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                                  cudaDriverEntryPointQueryResult*);

cudaError_t get_entry_point(runtime_symbol& real, bool per_thread_build, const char* symbol, void** func,
                            unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  auto fn = real.get<entry_point_fn>();
  if (fn == nullptr) return cudaErrorNotSupported;
  const cudaError_t e = fn(symbol, func, flags, status);
  if (e == cudaSuccess && func != nullptr) {
    if (per_thread_build && flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
    if (void* ours = driver_substitute_for(symbol, runtime_version(), flags, *func)) *func = ours;
  }
  return e;
}

cudaError_t get_entry_point_by_version(runtime_symbol& real, bool per_thread_build, const char* symbol, void** func,
                                       unsigned int version, unsigned long long flags,
                                       cudaDriverEntryPointQueryResult* status) {
  auto fn = real.get<entry_point_by_version_fn>();
  if (fn == nullptr) return cudaErrorNotSupported;
  const cudaError_t e = fn(symbol, func, version, flags, status);
  if (e == cudaSuccess && func != nullptr) {
    if (per_thread_build && flags == cudaEnableDefault) flags = cudaEnablePerThreadDefaultStream;
    if (void* ours = driver_substitute_for(symbol, static_cast<int>(version), flags, *func)) *func = ours;
  }
  return e;
}

}  // namespace
}  // namespace vmmckpt::detail

using namespace vmmckpt::detail;

VMMCKPT_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                                    cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status);
    if (e == CUDA_SUCCESS && pfn != nullptr)
      if (void* ours = driver_substitute_for(symbol, cuda_version, flags, *pfn)) *pfn = ours;
    return e;
  });
}

VMMCKPT_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
  return guarded(CUDA_ERROR_UNKNOWN, [&] {
    const driver_api* d = driver();
    if (d == nullptr || d->cuGetProcAddress_v1 == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult e = d->cuGetProcAddress_v1(symbol, pfn, cuda_version, flags);
    if (e == CUDA_SUCCESS && pfn != nullptr)
      if (void* ours = driver_substitute_for(symbol, cuda_version, flags, *pfn)) *pfn = ours;
    return e;
  });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* symbol, void** func, unsigned long long flags,
                                                             cudaDriverEntryPointQueryResult* status) {
  return guarded(cudaErrorUnknown,
                 [&] { return get_entry_point(real_cudaGetDriverEntryPoint, false, symbol, func, flags, status); });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** func,
                                                                  unsigned long long flags,
                                                                  cudaDriverEntryPointQueryResult* status) {
  return guarded(cudaErrorUnknown,
                 [&] { return get_entry_point(real_cudaGetDriverEntryPoint_ptsz, true, symbol, func, flags, status); });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** func,
                                                                      unsigned int version, unsigned long long flags,
                                                                      cudaDriverEntryPointQueryResult* status) {
  return guarded(cudaErrorUnknown, [&] {
    return get_entry_point_by_version(real_cudaGetDriverEntryPointByVersion, false, symbol, func, version, flags,
                                      status);
  });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** func,
                                                                           unsigned int version,
                                                                           unsigned long long flags,
                                                                           cudaDriverEntryPointQueryResult* status) {
  return guarded(cudaErrorUnknown, [&] {
    return get_entry_point_by_version(real_cudaGetDriverEntryPointByVersion_ptsz, true, symbol, func, version, flags,
                                      status);
  });
}

// ---- dlsym ----------------------------------------------------------------
//
// glibc resolves dlsym(RTLD_NEXT, ...) relative to its caller's return address,
// so that case must reach glibc with the program's return address intact: a
// tail jump in assembly, not a call. Every other handle goes to dlsym_impl.

extern "C" {
__attribute__((visibility("hidden"))) void* vmmckpt_glibc_dlsym = nullptr;
__attribute__((visibility("hidden"))) void* vmmckpt_dlsym_impl(void* handle, const char* name);
}

// No ASan instrumentation on the path every early lookup takes: the ASan runtime resolves its
// interceptors with dlsym before our constructor and before its shadow memory exists.
__attribute__((no_sanitize_address)) void* vmmckpt_dlsym_impl(void* handle, const char* name) {
  void* real = real_dlsym(handle, name);
  // Every name we substitute starts with "cu"; other lookups return at once.
  if (real == nullptr || name == nullptr || name[0] != 'c' || name[1] != 'u') return real;
  if (!shim_active()) return real;
  const std::string_view wanted(name);
  for (const auto& s : symbol_substitutes) {
    if (s.name == wanted) {
      if (s.ours != real) log::debug("dlsym: {} served by the pool", name);
      return s.ours;
    }
  }
  if (void* gated = gated_substitute_for_name(wanted)) return gated;
  return real;
}

// Filled at load (no thread, file or socket: the shim stays inert), or by the first
// dlsym(RTLD_NEXT, ...) when that comes earlier: libraries initialised before us (the ASan runtime,
// any interposer) must get the symbol after *them*, not after the shim.
extern "C" __attribute__((visibility("hidden"), no_sanitize_address)) void* vmmckpt_find_glibc_dlsym() {
  void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
  vmmckpt_glibc_dlsym = p;
  return p;
}

namespace {
__attribute__((constructor)) void find_glibc_dlsym() { vmmckpt_find_glibc_dlsym(); }
}  // namespace

#if defined(__x86_64__)
asm(R"(
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    cmpq $-1, %rdi
    jne 1f
    movq vmmckpt_glibc_dlsym(%rip), %rax
    testq %rax, %rax
    jne 2f
    pushq %rdi
    pushq %rsi
    subq $8, %rsp
    call vmmckpt_find_glibc_dlsym
    addq $8, %rsp
    popq %rsi
    popq %rdi
    testq %rax, %rax
    je 1f
2:
    jmp *%rax
1:
    jmp vmmckpt_dlsym_impl
    .size dlsym, .-dlsym
)");
#elif defined(__aarch64__)
asm(R"(
    .text
    .globl dlsym
    .type dlsym, %function
dlsym:
    cmn x0, #1
    b.ne 1f
    adrp x16, vmmckpt_glibc_dlsym
    ldr x16, [x16, :lo12:vmmckpt_glibc_dlsym]
    cbz x16, 1f
    br x16
1:
    b vmmckpt_dlsym_impl
    .size dlsym, .-dlsym
)");
#else
#error "vmmckpt's dlsym trampoline supports x86-64 and arm64"
#endif
