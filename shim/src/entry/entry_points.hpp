// Helpers shared by the exported entry points: device lookup, pool calls, the no-throw guard.
#pragma once

#include <cuda.h>

#include <atomic>
#include <new>

#include "vmmckpt/support/log.hpp"
#include "memory/pools.hpp"
#include "core/real_symbols.hpp"
#include "vmmckpt/pool/alloc_api.hpp"

#define VMMCKPT_EXPORT extern "C" __attribute__((visibility("default")))

namespace vmmckpt::detail {

// Runs an entry point's body; nothing thrown ever reaches the host program.
template <typename Result, typename Body>
Result guarded(Result on_exception, Body&& body) noexcept {
  try {
    return body();
  } catch (...) {
    return on_exception;
  }
}

// guarded() for an entry point that calls the real driver: body(table), or CUDA_ERROR_NOT_INITIALIZED
// when no driver was found.
template <typename Body>
CUresult with_driver(CUresult on_exception, Body&& body) noexcept {
  return guarded(on_exception, [&] {
    const driver_api* d = driver();
    return d == nullptr ? CUDA_ERROR_NOT_INITIALIZED : body(*d);
  });
}

// The device of the calling thread's current context.
CUresult current_device(int& ordinal);
// The device a stream belongs to (the current one for the default streams).
CUresult stream_device(CUstream stream, int& ordinal);

CUresult pool_allocate(int ordinal, std::size_t size, alloc_api api, CUdeviceptr& out);
// True when addr lies in a pool, with the outcome of freeing it in `result`;
// false means the pointer is not ours and the caller passes it on.
bool pool_free(CUdeviceptr addr, CUresult& result);

// Pitch of pitched allocations: fixed, so placement stays model-independent.
inline constexpr std::size_t pitch_alignment = 512;

// Names a program uses that the pool does not serve, once per process.
#define VMMCKPT_NOT_SERVED(what)                                                           \
  do {                                                                                     \
    static std::atomic<bool> said{false};                                                  \
    if (!said.exchange(true))                                                              \
      ::vmmckpt::log::warn("{} is not served by the pool: that memory passes through and " \
                           "is not part of checkpoints",                                   \
                           what);                                                          \
  } while (0)

}  // namespace vmmckpt::detail
