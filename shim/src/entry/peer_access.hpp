// Copies between devices on pool memory: the devices taking part get access to the pools involved, since the
// driver stages no copy of VMM memory through the host and peer access does not extend to VMM memory.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "memory/pools.hpp"

namespace vmmckpt::detail {

// The slow path, once pools of several devices exist: each device taking part in a copy (the calling
// thread's context's, the stream's, the contexts named, each pool's own) gets access to each pool involved
// that it lacks, where cuDeviceCanAccessPeer allows the pair. Once every device that can has access to the
// pools involved, this is a pool lookup and a mask test per pointer.
void reach_for_copy(std::initializer_list<CUdeviceptr> pointers, std::initializer_list<CUcontext> contexts,
                    CUstream stream) noexcept;

// Where a gated entry point's arguments name device memory.
enum class copy_shape {
  none,
  dst_src,         // (dst, src, ...): cuMemcpy, cuMemcpyAsync, cuMemcpyDtoD
  first,           // the first argument: HtoD, AtoD, memsets
  second,          // DtoH
  third,           // DtoA
  peer,            // (dst, dst context, src, src context, ...)
  described,       // a CUDA_MEMCPY2D/3D
  described_peer,  // a CUDA_MEMCPY3D_PEER
  batch,           // arrays of dsts and srcs
};

constexpr bool starts_with(std::string_view name, std::string_view prefix) {
  return name.substr(0, prefix.size()) == prefix;
}

// From the generated list's names (gated_entry_points.inc), at compile time.
constexpr copy_shape copy_shape_of(std::string_view n) {
  if (starts_with(n, "cuMemset")) return copy_shape::first;
  if (!starts_with(n, "cuMemcpy")) return copy_shape::none;
  // Operands of several kinds (pointers, arrays, host) in one list: not followed (docs/pool.md).
  if (starts_with(n, "cuMemcpy3DBatchAsync")) return copy_shape::none;
  if (starts_with(n, "cuMemcpyBatchAsync")) return copy_shape::batch;
  if (starts_with(n, "cuMemcpy3DPeer")) return copy_shape::described_peer;
  if (starts_with(n, "cuMemcpy2D") || starts_with(n, "cuMemcpy3D")) return copy_shape::described;
  if (starts_with(n, "cuMemcpyPeer")) return copy_shape::peer;
  if (starts_with(n, "cuMemcpyDtoH")) return copy_shape::second;
  if (starts_with(n, "cuMemcpyDtoA")) return copy_shape::third;
  if (starts_with(n, "cuMemcpyHtoD") || starts_with(n, "cuMemcpyAtoD")) return copy_shape::first;
  if (starts_with(n, "cuMemcpyDtoD") || starts_with(n, "cuMemcpyAsync") || n == "cuMemcpy" || n == "cuMemcpy_ptds")
    return copy_shape::dst_src;
  return copy_shape::none;  // arrays or host memory on both sides
}
static_assert(copy_shape_of("cuMemcpyPeerAsync_ptsz") == copy_shape::peer);
static_assert(copy_shape_of("cuMemcpy3DPeer_ptds") == copy_shape::described_peer);
static_assert(copy_shape_of("cuMemcpy2DUnaligned_v2") == copy_shape::described);
static_assert(copy_shape_of("cuMemcpyDtoHAsync_v2") == copy_shape::second);
static_assert(copy_shape_of("cuMemcpyAtoH_v2") == copy_shape::none);
static_assert(copy_shape_of("cuLaunchKernel") == copy_shape::none);

template <typename T>
CUdeviceptr as_device_pointer(T v) {
  if constexpr (std::is_pointer_v<T>)
    return reinterpret_cast<std::uintptr_t>(v);
  else
    return static_cast<CUdeviceptr>(v);
}

// The device-side pointers of a 2D/3D description (host and array sides name none).
template <typename Description>
std::tuple<CUdeviceptr, CUdeviceptr> described_pointers(const Description& p) {
  auto on_device = [](CUmemorytype t) { return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED; };
  return {on_device(p.srcMemoryType) ? as_device_pointer(p.srcDevice) : 0,
          on_device(p.dstMemoryType) ? as_device_pointer(p.dstDevice) : 0};
}

// Called by every gated entry point before the driver's, inside the gate. Nothing for those that copy
// nothing; for copies a relaxed load while a single device has a pool (the common case), then the slow path.
template <copy_shape Shape, typename... Args>
inline void before_copy([[maybe_unused]] Args... args) noexcept {
  if constexpr (Shape != copy_shape::none) {
    if (!several_pools_exist.load(std::memory_order_relaxed)) [[likely]]
      return;
    const std::tuple<Args...> a(args...);
    CUstream stream = nullptr;
    if constexpr (std::is_same_v<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>, CUstream>)
      stream = std::get<sizeof...(Args) - 1>(a);
    if constexpr (Shape == copy_shape::dst_src) {
      reach_for_copy({as_device_pointer(std::get<0>(a)), as_device_pointer(std::get<1>(a))}, {}, stream);
    } else if constexpr (Shape == copy_shape::first) {
      reach_for_copy({as_device_pointer(std::get<0>(a))}, {}, stream);
    } else if constexpr (Shape == copy_shape::second) {
      reach_for_copy({as_device_pointer(std::get<1>(a))}, {}, stream);
    } else if constexpr (Shape == copy_shape::third) {
      reach_for_copy({as_device_pointer(std::get<2>(a))}, {}, stream);
    } else if constexpr (Shape == copy_shape::peer) {
      reach_for_copy({as_device_pointer(std::get<0>(a)), as_device_pointer(std::get<2>(a))},
                     {std::get<1>(a), std::get<3>(a)}, stream);
    } else if constexpr (Shape == copy_shape::described) {
      if (const auto* p = std::get<0>(a)) {
        const auto [src, dst] = described_pointers(*p);
        reach_for_copy({src, dst}, {}, stream);
      }
    } else if constexpr (Shape == copy_shape::described_peer) {
      if (const auto* p = std::get<0>(a)) {
        const auto [src, dst] = described_pointers(*p);
        reach_for_copy({src, dst}, {p->srcContext, p->dstContext}, stream);
      }
    } else if constexpr (Shape == copy_shape::batch) {
      const auto* dsts = std::get<0>(a);
      const auto* srcs = std::get<1>(a);
      const std::size_t count = std::get<3>(a);
      if (dsts != nullptr && srcs != nullptr)
        for (std::size_t i = 0; i < count; ++i) reach_for_copy({dsts[i], srcs[i]}, {}, stream);
    }
  }
}

}  // namespace vmmckpt::detail
