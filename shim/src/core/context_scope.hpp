// A context made current for a scope, and the caller's own put back: the shim's driver calls on a device's
// memory (pools, VMM checkpoints, usage figures) run in that device's context whatever thread calls.
#pragma once

#include <cuda.h>

#include "vmmckpt/support/driver_api.hpp"

namespace vmmckpt::detail {

// `ctx` current until the scope ends; active() is false when the push failed.
class context_scope {
 public:
  context_scope(const driver_api& d, CUcontext ctx) : d_(d) { pushed_ = d_.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS; }
  ~context_scope() {
    CUcontext popped;
    if (pushed_) d_.cuCtxPopCurrent_v2(&popped);
  }
  context_scope(const context_scope&) = delete;
  context_scope& operator=(const context_scope&) = delete;
  bool active() const { return pushed_; }

 private:
  const driver_api& d_;
  bool pushed_;
};

// Device `ordinal`'s primary context, retained and current until the scope ends (then popped and released).
// active() is false when there is no such device or context.
class primary_context_scope {
 public:
  primary_context_scope(const driver_api& d, int ordinal) : d_(d) {
    CUcontext ctx;
    if (d_.cuDeviceGet(&device_, ordinal) != CUDA_SUCCESS || d_.cuDevicePrimaryCtxRetain(&ctx, device_) != CUDA_SUCCESS)
      return;
    retained_ = true;
    pushed_ = d_.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
  }
  ~primary_context_scope() {
    CUcontext popped;
    if (pushed_) d_.cuCtxPopCurrent_v2(&popped);
    if (retained_) d_.cuDevicePrimaryCtxRelease_v2(device_);
  }
  primary_context_scope(const primary_context_scope&) = delete;
  primary_context_scope& operator=(const primary_context_scope&) = delete;
  bool active() const { return pushed_; }

 private:
  const driver_api& d_;
  CUdevice device_ = 0;
  bool retained_ = false;
  bool pushed_ = false;
};

}  // namespace vmmckpt::detail
