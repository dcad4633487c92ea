// Copies and memsets. Synchronous forms run in legacy-stream order on the calling thread (waiting
// for the work they must follow first); asynchronous forms are queued on the stream, except that a
// copy touching pageable host memory completes before returning, as on the real driver.
#include "config.hpp"
#include "emu_api.hpp"
#include "memory_map.hpp"
#include "state.hpp"

#include <cstring>

using namespace vmmckpt::emu;

namespace {

enum class mode { sync, async };

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

CUresult run(CUstream h, mode m, bool pageable, stream_engine::task work) {
  std::shared_ptr<stream_engine> s;
  if (CUresult rc = resolve_stream(m == mode::sync ? nullptr : h, s); rc != CUDA_SUCCESS) return rc;
  if (m == mode::sync) {
    run_ordered_and_wait(s, work);
  } else if (pageable) {
    s->wait_for(submit(s, std::move(work)));
  } else {
    submit(s, std::move(work));
  }
  return CUDA_SUCCESS;
}

CUresult need_init() { return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

CUresult copy_htod(CUdeviceptr dst, const void* src, std::size_t n, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = check_device_range(dst, n, access_need::write); rc != CUDA_SUCCESS) return rc;
  return run(h, m, !is_page_locked(addr(src), n),
             [=] { std::memcpy(reinterpret_cast<void*>(dst), src, n); });
}

CUresult copy_dtoh(void* dst, CUdeviceptr src, std::size_t n, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = check_device_range(src, n, access_need::read); rc != CUDA_SUCCESS) return rc;
  return run(h, m, !is_page_locked(addr(dst), n),
             [=] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
}

CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, std::size_t n, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult rc = check_device_range(dst, n, access_need::write); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_device_range(src, n, access_need::read); rc != CUDA_SUCCESS) return rc;
  return run(h, m, false, [=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
}

// cuMemcpy/cuMemcpyAsync: unified addressing decides each side from the address.
CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, std::size_t n, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult rc = check_any_range(dst, n, access_need::write); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_any_range(src, n, access_need::read); rc != CUDA_SUCCESS) return rc;
  const bool pageable = check_device_range(dst, n, access_need::write) != CUDA_SUCCESS ||
                        check_device_range(src, n, access_need::read) != CUDA_SUCCESS;
  return run(h, m, pageable, [=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
}

template <typename T>
void fill(std::uintptr_t dst, T value, std::size_t count) {
  if constexpr (sizeof(T) == 1) {
    std::memset(reinterpret_cast<void*>(dst), value, count);
  } else {
    auto* p = reinterpret_cast<T*>(dst);
    for (std::size_t i = 0; i < count; ++i) p[i] = value;
  }
}

template <typename T>
CUresult memset_2d(CUdeviceptr dst, std::size_t pitch, T value, std::size_t width, std::size_t height, CUstream h,
                   mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (dst % sizeof(T) != 0 || (height > 1 && pitch < width * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  if (height > 1 && pitch % sizeof(T) != 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t span = (height - 1) * pitch + width * sizeof(T);
  if (CUresult rc = check_device_range(dst, span, access_need::write); rc != CUDA_SUCCESS) return rc;
  return run(h, m, false, [=] {
    for (std::size_t row = 0; row < height; ++row) fill<T>(dst + row * pitch, value, width);
  });
}

template <typename T>
CUresult memset_1d(CUdeviceptr dst, T value, std::size_t count, CUstream h, mode m) {
  return memset_2d<T>(dst, count * sizeof(T), value, count, 1, h, m);
}

// One side of a 2D copy: its first byte and whether it is device-visible memory.
CUresult copy_2d_side(CUmemorytype type, const void* host, CUdeviceptr device, std::size_t x, std::size_t y,
                      std::size_t pitch, std::size_t width, std::size_t height, access_need need,
                      std::uintptr_t& start, bool& pageable) {
  std::uintptr_t base = 0;
  switch (type) {
    case CU_MEMORYTYPE_HOST: base = addr(host); break;
    case CU_MEMORYTYPE_DEVICE:
    case CU_MEMORYTYPE_UNIFIED: base = device; break;
    default:
      trace("cuMemcpy2D: CUDA arrays are not emulated");
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (base == 0) return CUDA_ERROR_INVALID_VALUE;
  if (height > 1 && pitch < width) return CUDA_ERROR_INVALID_VALUE;
  start = base + y * pitch + x;
  const std::size_t span = (height - 1) * pitch + width;
  if (type == CU_MEMORYTYPE_HOST) {
    pageable = pageable || !is_page_locked(start, span);
    return CUDA_SUCCESS;
  }
  if (type == CU_MEMORYTYPE_UNIFIED) {
    if (CUresult rc = check_any_range(start, span, need); rc != CUDA_SUCCESS) return rc;
    pageable = pageable || check_device_range(start, span, need) != CUDA_SUCCESS;
    return CUDA_SUCCESS;
  }
  return check_device_range(start, span, need);
}

CUresult copy_2d(const CUDA_MEMCPY2D* p, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t width = p->WidthInBytes;
  const std::size_t height = p->Height;
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  std::uintptr_t src = 0;
  std::uintptr_t dst = 0;
  bool pageable = false;
  if (CUresult rc = copy_2d_side(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, p->srcPitch,
                                 width, height, access_need::read, src, pageable);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (CUresult rc = copy_2d_side(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY, p->dstPitch,
                                 width, height, access_need::write, dst, pageable);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  const std::size_t spitch = p->srcPitch;
  const std::size_t dpitch = p->dstPitch;
  return run(h, m, pageable, [=] {
    for (std::size_t row = 0; row < height; ++row) {
      std::memmove(reinterpret_cast<void*>(dst + row * dpitch), reinterpret_cast<const void*>(src + row * spitch), width);
    }
  });
}

}  // namespace

extern "C" {

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return guarded([&] { return copy_htod(dst, src, n, nullptr, mode::sync); });
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return guarded([&] { return copy_dtoh(dst, src, n, nullptr, mode::sync); });
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guarded([&] { return copy_dtod(dst, src, n, nullptr, mode::sync); });
}
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guarded([&] { return copy_any(dst, src, n, nullptr, mode::sync); });
}
CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext, size_t n) {
  return guarded([&] { return copy_dtod(dst, src, n, nullptr, mode::sync); });
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream h) {
  return guarded([&] { return copy_htod(dst, src, n, h, mode::async); });
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream h) {
  return guarded([&] { return copy_dtoh(dst, src, n, h, mode::async); });
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  return guarded([&] { return copy_dtod(dst, src, n, h, mode::async); });
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  return guarded([&] { return copy_any(dst, src, n, h, mode::async); });
}
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext, size_t n, CUstream h) {
  return guarded([&] { return copy_dtod(dst, src, n, h, mode::async); });
}
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D* p) {
  return guarded([&] { return copy_2d(p, nullptr, mode::sync); });
}
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* p) {
  return guarded([&] { return copy_2d(p, nullptr, mode::sync); });
}
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* p, CUstream h) {
  return guarded([&] { return copy_2d(p, h, mode::async); });
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  return guarded([&] { return memset_1d<unsigned char>(dst, v, n, nullptr, mode::sync); });
}
CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, size_t n) {
  return guarded([&] { return memset_1d<unsigned short>(dst, v, n, nullptr, mode::sync); });
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n) {
  return guarded([&] { return memset_1d<unsigned int>(dst, v, n, nullptr, mode::sync); });
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream h) {
  return guarded([&] { return memset_1d<unsigned char>(dst, v, n, h, mode::async); });
}
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, CUstream h) {
  return guarded([&] { return memset_1d<unsigned short>(dst, v, n, h, mode::async); });
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream h) {
  return guarded([&] { return memset_1d<unsigned int>(dst, v, n, h, mode::async); });
}
CUresult cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t ht) {
  return guarded([&] { return memset_2d<unsigned char>(dst, pitch, v, w, ht, nullptr, mode::sync); });
}
CUresult cuMemsetD2D16_v2(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t ht) {
  return guarded([&] { return memset_2d<unsigned short>(dst, pitch, v, w, ht, nullptr, mode::sync); });
}
CUresult cuMemsetD2D32_v2(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t ht) {
  return guarded([&] { return memset_2d<unsigned int>(dst, pitch, v, w, ht, nullptr, mode::sync); });
}
CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t ht, CUstream h) {
  return guarded([&] { return memset_2d<unsigned char>(dst, pitch, v, w, ht, h, mode::async); });
}
CUresult cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t ht, CUstream h) {
  return guarded([&] { return memset_2d<unsigned short>(dst, pitch, v, w, ht, h, mode::async); });
}
CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t ht, CUstream h) {
  return guarded([&] { return memset_2d<unsigned int>(dst, pitch, v, w, ht, h, mode::async); });
}

}  // extern "C"

// Per-thread-default-stream variants: the emulator gives them legacy-stream semantics.
VMMCKPT_EMU_ALIAS(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2)
VMMCKPT_EMU_ALIAS(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2)
VMMCKPT_EMU_ALIAS(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2)
VMMCKPT_EMU_ALIAS(cuMemcpy_ptds, cuMemcpy)
VMMCKPT_EMU_ALIAS(cuMemcpyPeer_ptds, cuMemcpyPeer)
VMMCKPT_EMU_ALIAS(cuMemcpy2D_v2_ptds, cuMemcpy2D_v2)
VMMCKPT_EMU_ALIAS(cuMemcpy2DUnaligned_v2_ptds, cuMemcpy2DUnaligned_v2)
VMMCKPT_EMU_ALIAS(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2)
VMMCKPT_EMU_ALIAS(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2)
VMMCKPT_EMU_ALIAS(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2)
VMMCKPT_EMU_ALIAS(cuMemcpyAsync_ptsz, cuMemcpyAsync)
VMMCKPT_EMU_ALIAS(cuMemcpyPeerAsync_ptsz, cuMemcpyPeerAsync)
VMMCKPT_EMU_ALIAS(cuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync_v2)
VMMCKPT_EMU_ALIAS(cuMemsetD8_v2_ptds, cuMemsetD8_v2)
VMMCKPT_EMU_ALIAS(cuMemsetD16_v2_ptds, cuMemsetD16_v2)
VMMCKPT_EMU_ALIAS(cuMemsetD32_v2_ptds, cuMemsetD32_v2)
VMMCKPT_EMU_ALIAS(cuMemsetD8Async_ptsz, cuMemsetD8Async)
VMMCKPT_EMU_ALIAS(cuMemsetD16Async_ptsz, cuMemsetD16Async)
VMMCKPT_EMU_ALIAS(cuMemsetD32Async_ptsz, cuMemsetD32Async)
VMMCKPT_EMU_ALIAS(cuMemsetD2D8_v2_ptds, cuMemsetD2D8_v2)
VMMCKPT_EMU_ALIAS(cuMemsetD2D16_v2_ptds, cuMemsetD2D16_v2)
VMMCKPT_EMU_ALIAS(cuMemsetD2D32_v2_ptds, cuMemsetD2D32_v2)
VMMCKPT_EMU_ALIAS(cuMemsetD2D8Async_ptsz, cuMemsetD2D8Async)
VMMCKPT_EMU_ALIAS(cuMemsetD2D16Async_ptsz, cuMemsetD2D16Async)
VMMCKPT_EMU_ALIAS(cuMemsetD2D32Async_ptsz, cuMemsetD2D32Async)
