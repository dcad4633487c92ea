// The runtime API doors into the pool, for programs that link libcudart.so.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "entry/entry_points.hpp"
#include "vmmckpt/pool/pool_layout.hpp"

extern "C" {
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** dev_ptr, size_t size, cudaStream_t stream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* dev_ptr, cudaStream_t stream);
}

namespace vmmckpt::detail {
namespace {

runtime_symbol real_cudaGetDevice{"cudaGetDevice"};
runtime_symbol real_cudaMalloc{"cudaMalloc"};
runtime_symbol real_cudaMallocPitch{"cudaMallocPitch"};
runtime_symbol real_cudaMallocAsync{"cudaMallocAsync"};
runtime_symbol real_cudaMallocAsync_ptsz{"cudaMallocAsync_ptsz"};
runtime_symbol real_cudaFree{"cudaFree"};
runtime_symbol real_cudaFreeAsync{"cudaFreeAsync"};
runtime_symbol real_cudaFreeAsync_ptsz{"cudaFreeAsync_ptsz"};
runtime_symbol real_cudaMemGetInfo{"cudaMemGetInfo"};

cudaError_t to_runtime_error(CUresult e) {
  switch (e) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    default: return cudaErrorUnknown;
  }
}

// The runtime device of the calling thread, with the runtime's context made
// current as a native cudaMalloc would leave it (programs may mix in driver calls).
cudaError_t runtime_device(int& device) {
  auto get_device = real_cudaGetDevice.get<cudaError_t (*)(int*)>();
  if (get_device == nullptr) return cudaErrorInitializationError;
  const cudaError_t e = get_device(&device);
  if (e != cudaSuccess) return e;
  thread_local int initialized_device = -1;
  if (initialized_device != device) {
    if (auto free_fn = real_cudaFree.get<cudaError_t (*)(void*)>()) {
      const cudaError_t init = free_fn(nullptr);  // the runtime's own way to initialize
      if (init != cudaSuccess) return init;
    }
    initialized_device = device;
  }
  return cudaSuccess;
}

// A failed allocation must also be the runtime's "last error", as natively:
// programs call cudaGetLastError() after a failure. An impossible request to
// the real cudaMalloc records it.
cudaError_t runtime_failure(CUresult e) {
  const cudaError_t error = to_runtime_error(e);
  if (error == cudaErrorMemoryAllocation) {
    if (auto malloc_fn = real_cudaMalloc.get<cudaError_t (*)(void**, size_t)>()) {
      void* unused = nullptr;
      malloc_fn(&unused, SIZE_MAX);
    }
  }
  return error;
}

cudaError_t runtime_allocate(void** dev_ptr, std::size_t size, alloc_api api, int device) {
  CUdeviceptr p = 0;
  const CUresult e = pool_allocate(device, size, api, p);
  if (e != CUDA_SUCCESS) return runtime_failure(e);
  *dev_ptr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

// cudaMallocAsync and its per-thread-stream twin: the real one while the shim is off, and for a null
// pointer (its own error).
cudaError_t malloc_async(runtime_symbol& real, void** dev_ptr, size_t size, cudaStream_t stream) {
  if (!shim_active() || dev_ptr == nullptr) {
    auto fn = real.get<cudaError_t (*)(void**, size_t, cudaStream_t)>();
    if (fn != nullptr) return fn(dev_ptr, size, stream);
    // No runtime of its own: with the shim off the call is not supported; on, the pointer is invalid.
    return shim_active() ? cudaErrorInvalidValue : cudaErrorNotSupported;
  }
  int device = 0;
  cudaError_t e = runtime_device(device);
  if (e != cudaSuccess) return e;
  if (size == 0) {
    *dev_ptr = nullptr;
    return cudaSuccess;
  }
  const CUresult se = stream_device(reinterpret_cast<CUstream>(stream), device);
  if (se != CUDA_SUCCESS) return to_runtime_error(se);
  return runtime_allocate(dev_ptr, size, alloc_api::cuda_malloc_async, device);
}

cudaError_t free_async(runtime_symbol& real, void* dev_ptr, cudaStream_t stream) {
  CUresult result;
  // A refused free (double, interior) is handed to the real runtime too, so it
  // is answered and recorded as the last error natively.
  if (shim_active() && pool_free(reinterpret_cast<CUdeviceptr>(dev_ptr), result) && result == CUDA_SUCCESS)
    return cudaSuccess;
  auto fn = real.get<cudaError_t (*)(void*, cudaStream_t)>();
  return fn ? fn(dev_ptr, stream) : cudaErrorNotSupported;
}

}  // namespace
}  // namespace vmmckpt::detail

using namespace vmmckpt;
using namespace vmmckpt::detail;

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaMalloc(void** dev_ptr, size_t size) {
  return guarded(cudaErrorMemoryAllocation, [&] {
    if (!shim_active()) {
      auto fn = real_cudaMalloc.get<cudaError_t (*)(void**, size_t)>();
      return fn ? fn(dev_ptr, size) : cudaErrorInitializationError;
    }
    auto real = real_cudaMalloc.get<cudaError_t (*)(void**, size_t)>();
    // Argument errors go to the real runtime, which answers them and records
    // them as the last error exactly as it does natively.
    if (dev_ptr == nullptr) return real ? real(dev_ptr, size) : cudaErrorInvalidValue;
    int device = 0;
    const cudaError_t e = runtime_device(device);
    if (e != cudaSuccess) return e;
    if (size == 0) {
      *dev_ptr = nullptr;
      return cudaSuccess;
    }
    return runtime_allocate(dev_ptr, size, alloc_api::cuda_malloc, device);
  });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaMallocPitch(void** dev_ptr, size_t* pitch, size_t width, size_t height) {
  return guarded(cudaErrorMemoryAllocation, [&] {
    if (!shim_active()) {
      auto fn = real_cudaMallocPitch.get<cudaError_t (*)(void**, size_t*, size_t, size_t)>();
      return fn ? fn(dev_ptr, pitch, width, height) : cudaErrorInitializationError;
    }
    if (dev_ptr == nullptr || pitch == nullptr) {
      auto real = real_cudaMallocPitch.get<cudaError_t (*)(void**, size_t*, size_t, size_t)>();
      return real ? real(dev_ptr, pitch, width, height) : cudaErrorInvalidValue;
    }
    int device = 0;
    const cudaError_t e = runtime_device(device);
    if (e != cudaSuccess) return e;
    const std::size_t row = align_up(width, pitch_alignment);
    if (width == 0 || height == 0) {
      *dev_ptr = nullptr;
      *pitch = row;
      return cudaSuccess;
    }
    if (row < width || height > SIZE_MAX / row) return runtime_failure(CUDA_ERROR_OUT_OF_MEMORY);
    const cudaError_t r = runtime_allocate(dev_ptr, row * height, alloc_api::cuda_malloc_pitch, device);
    if (r == cudaSuccess) *pitch = row;
    return r;
  });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaMallocAsync(void** dev_ptr, size_t size, cudaStream_t stream) {
  return guarded(cudaErrorMemoryAllocation, [&] { return malloc_async(real_cudaMallocAsync, dev_ptr, size, stream); });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** dev_ptr, size_t size, cudaStream_t stream) {
  return guarded(cudaErrorMemoryAllocation,
                 [&] { return malloc_async(real_cudaMallocAsync_ptsz, dev_ptr, size, stream); });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaFree(void* dev_ptr) {
  return guarded(cudaErrorUnknown, [&] {
    CUresult result;
    if (dev_ptr != nullptr && shim_active() && pool_free(reinterpret_cast<CUdeviceptr>(dev_ptr), result) &&
        result == CUDA_SUCCESS)
      return cudaSuccess;
    // NULL included: cudaFree(0) is how programs initialize the runtime. A
    // refused pool free lands here too, so the runtime answers and records it.
    auto fn = real_cudaFree.get<cudaError_t (*)(void*)>();
    return fn ? fn(dev_ptr) : cudaErrorInitializationError;
  });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaFreeAsync(void* dev_ptr, cudaStream_t stream) {
  return guarded(cudaErrorUnknown, [&] { return free_async(real_cudaFreeAsync, dev_ptr, stream); });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* dev_ptr, cudaStream_t stream) {
  return guarded(cudaErrorUnknown, [&] { return free_async(real_cudaFreeAsync_ptsz, dev_ptr, stream); });
}

VMMCKPT_EXPORT cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  return guarded(cudaErrorUnknown, [&] {
    auto fn = real_cudaMemGetInfo.get<cudaError_t (*)(size_t*, size_t*)>();
    if (fn == nullptr) return cudaErrorInitializationError;
    const cudaError_t e = fn(free_bytes, total_bytes);
    int device = 0;
    auto get_device = real_cudaGetDevice.get<cudaError_t (*)(int*)>();
    const driver_api* d = driver();
    size_t driver_free = 0, driver_total = 0;
    // Recomputed from the real driver whichever way libcudart reached it, so the
    // pool's reusable bytes are counted exactly once.
    if (e == cudaSuccess && shim_active() && free_bytes != nullptr && get_device != nullptr && d != nullptr &&
        get_device(&device) == cudaSuccess && d->cuMemGetInfo_v2(&driver_free, &driver_total) == CUDA_SUCCESS) {
      *free_bytes = std::min<size_t>(driver_free + reusable_pool_bytes(device), driver_total);
    }
    return e;
  });
}
