// Primary and user contexts and the per-thread current-context stack.
#include "config.hpp"
#include "emu_api.hpp"
#include "state.hpp"

#include <algorithm>

using namespace vmmckpt::emu;

namespace {

// Resolves an explicit context argument, where NULL means the calling thread's current context.
CUresult context_or_current(CUcontext handle, context*& out) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) return require_context(out);
  if (!is_live_context(handle)) return CUDA_ERROR_INVALID_CONTEXT;
  out = from_handle(handle);
  return CUDA_SUCCESS;
}

constexpr unsigned valid_ctx_flags = CU_CTX_FLAGS_MASK;

}  // namespace

extern "C" {

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return guarded([&] {
    if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    context* ctx = primary_context(dev);
    std::lock_guard lock(ctx->mutex);
    if (!ctx->active) {
      ctx->active = true;
      ctx->flags = ctx->primary_flags;
    }
    ++ctx->primary_refs;
    *pctx = to_handle(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return guarded([&] {
    if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
    context* ctx = primary_context(dev);
    {
      std::lock_guard lock(ctx->mutex);
      if (ctx->primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
      if (--ctx->primary_refs > 0) return CUDA_SUCCESS;
    }
    // Last release destroys the context like the real driver. Simplification: device memory the
    // context allocated stays allocated (docs/emulator.md).
    deactivate_context(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return guarded([&] {
    if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    context* ctx = primary_context(dev);
    std::lock_guard lock(ctx->mutex);
    *flags = ctx->primary_flags;
    *active = ctx->active ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  return guarded([&] {
    if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
    if ((flags & ~valid_ctx_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
    context* ctx = primary_context(dev);
    std::lock_guard lock(ctx->mutex);
    ctx->primary_flags = flags;
    if (ctx->active) ctx->flags = flags;
    return CUDA_SUCCESS;
  });
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return guarded([&] {
    if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
    context* ctx = primary_context(dev);
    {
      std::lock_guard lock(ctx->mutex);
      if (!ctx->active) return CUDA_SUCCESS;
      ctx->primary_refs = 0;
    }
    deactivate_context(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return guarded([&] {
    if (CUresult rc = check_device(dev); rc != CUDA_SUCCESS) return rc;
    if (pctx == nullptr || (flags & ~valid_ctx_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
    context* ctx = create_user_context(dev, flags);
    push_context(ctx);
    *pctx = to_handle(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  if (params != nullptr && (params->numExecAffinityParams != 0 || params->cigParams != nullptr)) {
    vmmckpt::emu::trace("cuCtxCreate_v4: exec affinity / CIG parameters are not emulated");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return cuCtxCreate_v2(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext handle) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == nullptr || !is_live_context(handle)) return CUDA_ERROR_INVALID_CONTEXT;
    context* ctx = from_handle(handle);
    if (ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;  // primary contexts are released, not destroyed
    destroy_user_context(ctx);
    if (current_context() == ctx) pop_context();
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxSetCurrent(CUcontext handle) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (handle != nullptr && !is_live_context(handle)) return CUDA_ERROR_INVALID_CONTEXT;
    set_current_context(from_handle(handle));
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = to_handle(current_context());
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext handle) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == nullptr || !is_live_context(handle)) return CUDA_ERROR_INVALID_CONTEXT;
    push_context(from_handle(handle));
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  return guarded([&] {
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (current_context() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    context* top = pop_context();
    if (pctx != nullptr) *pctx = to_handle(top);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxGetDevice(CUdevice* device) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext handle) {
  context* ctx = nullptr;
  if (CUresult rc = context_or_current(handle, ctx); rc != CUDA_SUCCESS) return rc;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    synchronize_context(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxSynchronize_v2(CUcontext handle) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = context_or_current(handle, ctx); rc != CUDA_SUCCESS) return rc;
    synchronize_context(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxGetApiVersion(CUcontext handle, unsigned int* version) {
  context* ctx = nullptr;
  if (CUresult rc = context_or_current(handle, ctx); rc != CUDA_SUCCESS) return rc;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = 3020;  // what the real driver reports for every context since the _v2 API
  return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int* flags) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(ctx->mutex);
  *flags = ctx->flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetFlags(unsigned int flags) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if ((flags & ~valid_ctx_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(ctx->mutex);
  ctx->flags = flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext handle, unsigned long long* ctxId) {
  context* ctx = nullptr;
  if (CUresult rc = context_or_current(handle, ctx); rc != CUDA_SUCCESS) return rc;
  if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctxId = ctx->id;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (pvalue == nullptr || limit < 0 || limit >= CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(ctx->mutex);
  *pvalue = ctx->limits[limit];
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (limit < 0 || limit >= CU_LIMIT_MAX || limit == CU_LIMIT_SHMEM_SIZE || limit == CU_LIMIT_CIG_ENABLED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(ctx->mutex);
  ctx->limits[limit] = value;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCacheConfig(CUfunc_cache* pconfig) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (pconfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(ctx->mutex);
  *pconfig = ctx->cache_config;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCacheConfig(CUfunc_cache config) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  std::lock_guard lock(ctx->mutex);
  ctx->cache_config = config;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetSharedMemConfig(CUsharedconfig* pConfig) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  if (pConfig == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pConfig = CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetSharedMemConfig(CUsharedconfig) {
  context* ctx = nullptr;
  return require_context(ctx);
}

CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  context* ctx = nullptr;
  if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
  // Hopper's range: 0 is the lowest priority, -5 the highest.
  if (leastPriority != nullptr) *leastPriority = 0;
  if (greatestPriority != nullptr) *greatestPriority = -5;
  return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (peer == nullptr || !is_live_context(peer) || from_handle(peer) == ctx) return CUDA_ERROR_INVALID_CONTEXT;
    // The driver's answer for a pair cuDeviceCanAccessPeer refuses (the same device, or no P2P).
    if (!peer_capable(ctx->device, from_handle(peer)->device)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    std::lock_guard lock(ctx->mutex);
    if (std::find(ctx->peers.begin(), ctx->peers.end(), from_handle(peer)) != ctx->peers.end())
      return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    ctx->peers.push_back(from_handle(peer));
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  return guarded([&] {
    context* ctx = nullptr;
    if (CUresult rc = require_context(ctx); rc != CUDA_SUCCESS) return rc;
    if (peer == nullptr || !is_live_context(peer)) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard lock(ctx->mutex);
    const auto it = std::find(ctx->peers.begin(), ctx->peers.end(), from_handle(peer));
    if (it == ctx->peers.end()) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    ctx->peers.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxResetPersistingL2Cache(void) {
  context* ctx = nullptr;
  return require_context(ctx);
}

}  // extern "C"

// The v1 names of these functions have the same ABI; programs linked long ago call them directly.
VMMCKPT_EMU_ALIAS(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2)
VMMCKPT_EMU_ALIAS(cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2)
VMMCKPT_EMU_ALIAS(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2)
VMMCKPT_EMU_ALIAS(cuCtxDestroy, cuCtxDestroy_v2)
VMMCKPT_EMU_ALIAS(cuCtxPushCurrent, cuCtxPushCurrent_v2)
VMMCKPT_EMU_ALIAS(cuCtxPopCurrent, cuCtxPopCurrent_v2)
