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

// Where a copy or memset runs: its stream, and the device of that stream's context, which performs it.
struct target {
  std::shared_ptr<stream_engine> stream;
  device_set device = 0;
};

CUresult resolve(CUstream h, mode m, target& t) {
  if (CUresult rc = resolve_stream(m == mode::sync ? nullptr : h, t.stream); rc != CUDA_SUCCESS) return rc;
  t.device = device_bit(t.stream->owner()->device);
  return CUDA_SUCCESS;
}

CUresult run(const target& t, mode m, bool pageable, stream_engine::task work) {
  if (m == mode::sync) {
    run_ordered_and_wait(t.stream, work);
  } else if (pageable) {
    t.stream->wait_for(submit(t.stream, std::move(work)));
  } else {
    submit(t.stream, std::move(work));
  }
  return CUDA_SUCCESS;
}

CUresult need_init() { return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

// The devices of a peer copy's two contexts, which take part besides the stream's.
CUresult context_devices(CUcontext a, CUcontext b, device_set& out) {
  if (!is_live_context(a) || !is_live_context(b)) return CUDA_ERROR_INVALID_CONTEXT;
  out = device_bit(from_handle(a)->device) | device_bit(from_handle(b)->device);
  return CUDA_SUCCESS;
}

CUresult copy_htod(CUdeviceptr dst, const void* src, std::size_t n, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  target t;
  if (CUresult rc = resolve(h, m, t); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_device_range(dst, n, access_need::write, t.device); rc != CUDA_SUCCESS) return rc;
  return run(t, m, !is_page_locked(addr(src), n), [=] { std::memcpy(reinterpret_cast<void*>(dst), src, n); });
}

CUresult copy_dtoh(void* dst, CUdeviceptr src, std::size_t n, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  target t;
  if (CUresult rc = resolve(h, m, t); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_device_range(src, n, access_need::read, t.device); rc != CUDA_SUCCESS) return rc;
  return run(t, m, !is_page_locked(addr(dst), n), [=] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
}

// `extra`: devices taking part besides the stream's and the memory's (a peer copy's contexts).
CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, std::size_t n, CUstream h, mode m, device_set extra = 0) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  target t;
  if (CUresult rc = resolve(h, m, t); rc != CUDA_SUCCESS) return rc;
  const device_set devices = t.device | extra | devices_of(dst, n) | devices_of(src, n);
  if (CUresult rc = check_device_range(dst, n, access_need::write, devices); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_device_range(src, n, access_need::read, devices); rc != CUDA_SUCCESS) return rc;
  return run(t, m, false, [=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
}

CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, std::size_t n, CUstream h,
                   mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  device_set contexts = 0;
  if (CUresult rc = context_devices(dst_ctx, src_ctx, contexts); rc != CUDA_SUCCESS) return rc;
  return copy_dtod(dst, src, n, h, m, contexts);
}

// cuMemcpy/cuMemcpyAsync: unified addressing decides each side from the address.
CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, std::size_t n, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (n == 0) return CUDA_SUCCESS;
  target t;
  if (CUresult rc = resolve(h, m, t); rc != CUDA_SUCCESS) return rc;
  const device_set devices = t.device | devices_of(dst, n) | devices_of(src, n);
  if (CUresult rc = check_any_range(dst, n, access_need::write, devices); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_any_range(src, n, access_need::read, devices); rc != CUDA_SUCCESS) return rc;
  const bool pageable = check_device_range(dst, n, access_need::write) != CUDA_SUCCESS ||
                        check_device_range(src, n, access_need::read) != CUDA_SUCCESS;
  return run(t, m, pageable,
             [=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); });
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
  target t;
  if (CUresult rc = resolve(h, m, t); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = check_device_range(dst, span, access_need::write, t.device); rc != CUDA_SUCCESS) return rc;
  return run(t, m, false, [=] {
    for (std::size_t row = 0; row < height; ++row) fill<T>(dst + row * pitch, value, width);
  });
}

template <typename T>
CUresult memset_1d(CUdeviceptr dst, T value, std::size_t count, CUstream h, mode m) {
  return memset_2d<T>(dst, count * sizeof(T), value, count, 1, h, m);
}

// One side of a 2D or 3D copy, and the extent copied (depth 1 for 2D).
struct copy_side {
  CUmemorytype type;
  const void* host;
  CUdeviceptr device;
  std::size_t x, y, z, pitch, height;  // height: rows per layer (3D only)
};
struct copy_extent {
  std::size_t width, height, depth;
};

// The side's first byte and the span its rows cover.
CUresult locate(const copy_side& side, const copy_extent& e, std::uintptr_t& start, std::size_t& span) {
  std::uintptr_t base = 0;
  switch (side.type) {
    case CU_MEMORYTYPE_HOST: base = addr(side.host); break;
    case CU_MEMORYTYPE_DEVICE:
    case CU_MEMORYTYPE_UNIFIED: base = side.device; break;
    default: trace("cuMemcpy2D/3D: CUDA arrays are not emulated"); return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (base == 0) return CUDA_ERROR_INVALID_VALUE;
  if ((e.height > 1 || e.depth > 1) && side.pitch < e.width) return CUDA_ERROR_INVALID_VALUE;
  if (e.depth > 1 && side.height < e.height) return CUDA_ERROR_INVALID_VALUE;
  start = base + (side.z * side.height + side.y) * side.pitch + side.x;
  span = ((e.depth - 1) * side.height + (e.height - 1)) * side.pitch + e.width;
  return CUDA_SUCCESS;
}

CUresult check_side(CUmemorytype type, std::uintptr_t start, std::size_t span, access_need need, device_set devices,
                    bool& pageable) {
  if (type == CU_MEMORYTYPE_HOST) {
    pageable = pageable || !is_page_locked(start, span);
    return CUDA_SUCCESS;
  }
  if (type == CU_MEMORYTYPE_UNIFIED) {
    if (CUresult rc = check_any_range(start, span, need, devices); rc != CUDA_SUCCESS) return rc;
    pageable = pageable || check_device_range(start, span, need) != CUDA_SUCCESS;
    return CUDA_SUCCESS;
  }
  return check_device_range(start, span, need, devices);
}

// Every 2D and 3D form: `extra` as for copy_dtod.
CUresult copy_3d(const copy_side& from, const copy_side& to, const copy_extent& e, CUstream h, mode m,
                 device_set extra = 0) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (e.width == 0 || e.height == 0 || e.depth == 0) return CUDA_SUCCESS;
  std::uintptr_t src = 0, dst = 0;
  std::size_t src_span = 0, dst_span = 0;
  if (CUresult rc = locate(from, e, src, src_span); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = locate(to, e, dst, dst_span); rc != CUDA_SUCCESS) return rc;
  target t;
  if (CUresult rc = resolve(h, m, t); rc != CUDA_SUCCESS) return rc;
  device_set devices = t.device | extra;
  if (from.type != CU_MEMORYTYPE_HOST) devices |= devices_of(src, src_span);
  if (to.type != CU_MEMORYTYPE_HOST) devices |= devices_of(dst, dst_span);
  bool pageable = false;
  if (CUresult rc = check_side(from.type, src, src_span, access_need::read, devices, pageable); rc != CUDA_SUCCESS)
    return rc;
  if (CUresult rc = check_side(to.type, dst, dst_span, access_need::write, devices, pageable); rc != CUDA_SUCCESS)
    return rc;
  const std::size_t spitch = from.pitch, dpitch = to.pitch;
  const std::size_t slayer = from.height * spitch, dlayer = to.height * dpitch;
  return run(t, m, pageable, [=] {
    for (std::size_t z = 0; z < e.depth; ++z)
      for (std::size_t row = 0; row < e.height; ++row)
        std::memmove(reinterpret_cast<void*>(dst + z * dlayer + row * dpitch),
                     reinterpret_cast<const void*>(src + z * slayer + row * spitch), e.width);
  });
}

CUresult copy_2d(const CUDA_MEMCPY2D* p, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return copy_3d({p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, 0, p->srcPitch, 0},
                 {p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY, 0, p->dstPitch, 0},
                 {p->WidthInBytes, p->Height, 1}, h, m);
}

template <typename Desc>
copy_side source_of(const Desc& p) {
  return {p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight};
}
template <typename Desc>
copy_side destination_of(const Desc& p) {
  return {p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight};
}

CUresult copy_3d_plain(const CUDA_MEMCPY3D* p, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr || p->srcLOD != 0 || p->dstLOD != 0) return CUDA_ERROR_INVALID_VALUE;
  return copy_3d(source_of(*p), destination_of(*p), {p->WidthInBytes, p->Height, p->Depth}, h, m);
}

CUresult copy_3d_peer(const CUDA_MEMCPY3D_PEER* p, CUstream h, mode m) {
  if (CUresult rc = need_init(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr || p->srcLOD != 0 || p->dstLOD != 0) return CUDA_ERROR_INVALID_VALUE;
  device_set contexts = 0;
  if (CUresult rc = context_devices(p->dstContext, p->srcContext, contexts); rc != CUDA_SUCCESS) return rc;
  return copy_3d(source_of(*p), destination_of(*p), {p->WidthInBytes, p->Height, p->Depth}, h, m, contexts);
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
CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  return guarded([&] { return copy_peer(dst, dst_ctx, src, src_ctx, n, nullptr, mode::sync); });
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
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                           CUstream h) {
  return guarded([&] { return copy_peer(dst, dst_ctx, src, src_ctx, n, h, mode::async); });
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
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D* p) {
  return guarded([&] { return copy_3d_plain(p, nullptr, mode::sync); });
}
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* p, CUstream h) {
  return guarded([&] { return copy_3d_plain(p, h, mode::async); });
}
CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER* p) {
  return guarded([&] { return copy_3d_peer(p, nullptr, mode::sync); });
}
CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER* p, CUstream h) {
  return guarded([&] { return copy_3d_peer(p, h, mode::async); });
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
VMMCKPT_EMU_ALIAS(cuMemcpy3D_v2_ptds, cuMemcpy3D_v2)
VMMCKPT_EMU_ALIAS(cuMemcpy3DAsync_v2_ptsz, cuMemcpy3DAsync_v2)
VMMCKPT_EMU_ALIAS(cuMemcpy3DPeer_ptds, cuMemcpy3DPeer)
VMMCKPT_EMU_ALIAS(cuMemcpy3DPeerAsync_ptsz, cuMemcpy3DPeerAsync)
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
