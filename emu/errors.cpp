// cuGetErrorName and cuGetErrorString: every CUresult of the installed cuda.h has its name;
// the codes the emulator itself returns have the real driver's wording.
#include "emu_api.hpp"

namespace {

struct error_text {
  CUresult code;
  const char* name;
};

constexpr error_text names[] = {
#define VMMCKPT_ERROR(code) {code, #code},
#include "error_names.inc"
#undef VMMCKPT_ERROR
};

const char* name_of(CUresult code) {
  for (const auto& e : names) {
    if (e.code == code) return e.name;
  }
  return nullptr;
}

const char* description_of(CUresult code) {
  switch (code) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_DEINITIALIZED: return "driver shutting down";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_IMAGE: return "device kernel image is invalid";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_CONTEXT_ALREADY_CURRENT: return "context already current";
    case CUDA_ERROR_NO_BINARY_FOR_GPU: return "no kernel image is available for execution on the device";
    case CUDA_ERROR_INVALID_HANDLE: return "invalid resource handle";
    case CUDA_ERROR_NOT_FOUND: return "named symbol not found";
    case CUDA_ERROR_NOT_READY: return "device not ready";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
      return "part or all of the requested memory range is already mapped";
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return "pointer does not correspond to a registered memory region";
    case CUDA_ERROR_NOT_SUPPORTED: return "operation not supported";
    case CUDA_ERROR_NOT_PERMITTED: return "operation not permitted";
    case CUDA_ERROR_INVALID_PTX: return "a PTX JIT compilation failed";
    case CUDA_ERROR_SHARED_OBJECT_INIT_FAILED: return "shared object initialization failed";
    case CUDA_ERROR_OPERATING_SYSTEM: return "OS call failed or operation not supported on this OS";
    case CUDA_ERROR_ILLEGAL_STATE: return "the operation cannot be performed in the present state";
    case CUDA_ERROR_UNKNOWN: return "unknown error";
    default: return nullptr;
  }
}

}  // namespace

extern "C" {

CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pStr = name_of(error);
  return *pStr != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (name_of(error) == nullptr) {
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  const char* text = description_of(error);
  // A valid code the emulator never produces: its name is still a useful answer.
  *pStr = text != nullptr ? text : name_of(error);
  return CUDA_SUCCESS;
}

}  // extern "C"
