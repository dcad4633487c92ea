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

#include "entry/entry_points.hpp"
#include "entry/gated_entry_points.hpp"
#include "entry/served_entry_points.hpp"
#include "entry/undeclared_entry_points.hpp"

namespace vmmckpt::detail {
namespace {

// The shim's function for a cuGetProcAddress-style request, or null.
void* driver_substitute_for(const char* symbol, int cuda_version, cuuint64_t flags, void* real) noexcept {
  if (symbol == nullptr || real == nullptr || !shim_active()) return nullptr;
  const std::string_view name(symbol);
  const served_entry* best = nullptr;
  for (const auto& e : served_entries())
    if (e.proc_name != nullptr && e.proc_name == name && e.since <= cuda_version &&
        (best == nullptr || e.since > best->since))
      best = &e;
  if (best == nullptr) {
    void* gated = gated_substitute_for_pointer(real);
    if (gated != nullptr) log::debug("resolver: {} (CUDA {}) passes the gate", symbol, cuda_version);
    return gated;
  }
  void* ours = best->ours;
  if (best->twin != nullptr) {
    // Match the stream semantics the driver chose: compare with its per-thread twin.
    const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ||
                            (driver_library() != nullptr && real == real_dlsym(driver_library(), best->twin));
    if (per_thread)
      if (const served_entry* twin = served_by_symbol(best->twin)) ours = twin->ours;
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

using namespace vmmckpt;
using namespace vmmckpt::detail;

VMMCKPT_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                                                    CUdriverProcAddressQueryResult* status) {
  return with_driver(CUDA_ERROR_UNKNOWN, [&](const driver_api& d) {
    const CUresult e = d.cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status);
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
__attribute__((visibility("hidden"))) void* vmmckpt_dlsym_impl(void* handle, const char* name) noexcept;
}

// No ASan instrumentation on the path every early lookup takes: the ASan runtime resolves its
// interceptors with dlsym before our constructor and before its shadow memory exists.
__attribute__((no_sanitize_address)) void* vmmckpt_dlsym_impl(void* handle, const char* name) noexcept {
  void* real = real_dlsym(handle, name);
  // Every name we substitute starts with "cu"; other lookups return at once.
  if (real == nullptr || name == nullptr || name[0] != 'c' || name[1] != 'u') return real;
  if (!shim_active()) return real;
  const std::string_view wanted(name);
  if (const served_entry* e = served_by_symbol(wanted)) {
    if (e->ours != real) log::debug("dlsym: {} served by the pool", name);
    return e->ours;
  }
  if (void* gated = gated_substitute_for_name(wanted)) return gated;
  return real;
}

// Filled at load (no thread, file or socket: the shim stays inert), or by the first
// dlsym(RTLD_NEXT, ...) when that comes earlier: libraries initialised before us (the ASan runtime,
// any interposer) must get the symbol after *them*, not after the shim.
extern "C" __attribute__((visibility("hidden"), no_sanitize_address)) void* vmmckpt_find_glibc_dlsym() noexcept {
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
