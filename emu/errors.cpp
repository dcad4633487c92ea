// cuGetErrorName and cuGetErrorString: every CUresult of the installed cuda.h has its name;
// the codes the emulator itself returns have the real driver's wording.
#include "emu_api.hpp"

#include <cstddef>

namespace {

struct error_text {
  CUresult code;
  const char* text;
};

constexpr error_text names[] = {
#define VMMCKPT_ERROR(code) {code, #code},
#include "error_names.inc"
#undef VMMCKPT_ERROR
};

// The real driver's wording of the codes the emulator returns.
constexpr error_text descriptions[] = {
    {CUDA_SUCCESS, "no error"},
    {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
    {CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
    {CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"},
    {CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed"},
    {CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"},
    {CUDA_ERROR_UNKNOWN, "unknown error"},
};

template <std::size_t N>
const char* text_of(const error_text (&table)[N], CUresult code) {
  for (const auto& e : table)
    if (e.code == code) return e.text;
  return nullptr;
}

const char* name_of(CUresult code) { return text_of(names, code); }
const char* description_of(CUresult code) { return text_of(descriptions, code); }

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
