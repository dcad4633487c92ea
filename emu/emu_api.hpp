// Common include for every emulator source: the real cuda.h with exact exported names, and the guard
// that keeps C++ exceptions from crossing the C ABI.
#pragma once

// Stops cuda.h from renaming cuMemAlloc to cuMemAlloc_v2 etc., so we define the exact exported names.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <new>
#include <utility>

// Defines an alias symbol (e.g. the _ptsz variant) for an already-defined exported C function.
// The emulator treats the per-thread default stream as the legacy stream (docs/emulator.md).
#define VMMCKPT_EMU_ALIAS(alias_name, target) extern "C" __attribute__((alias(#target))) decltype(target) alias_name;

namespace vmmckpt::emu {

bool in_forked_child();

// Runs the body of an exported function; exceptions become CUDA error codes because an exception
// unwinding into a C caller (libcudart, the shim) is undefined behaviour.
template <typename F>
CUresult guarded(F&& body) noexcept {
  if (in_forked_child()) return CUDA_ERROR_NOT_INITIALIZED;
  try {
    return std::forward<F>(body)();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace vmmckpt::emu
