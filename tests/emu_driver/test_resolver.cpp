// Tests of cuGetProcAddress version mapping, error strings, and the checkpoint API's answer.
#include "emu_test_support.hpp"

#include <dlfcn.h>

#include <string>

using namespace emu_test;

namespace {

void* exported(const char* name) { return dlsym(RTLD_DEFAULT, name); }

void* resolve(const char* name, int version, CUresult expect = CUDA_SUCCESS,
              CUdriverProcAddressQueryResult expect_status = CU_GET_PROC_ADDRESS_SUCCESS) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status{};
  REQUIRE(cuGetProcAddress_v2(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == expect);
  REQUIRE(status == expect_status);
  return fn;
}

}  // namespace

TEST_CASE("cuGetProcAddress maps base names and versions to the right ABI", "[resolver]") {
  current_context();
  // With a status pointer, a failed lookup answers CUDA_SUCCESS and says why in the status
  // (as driver 580 does); without one it answers CUDA_ERROR_NOT_FOUND.
  REQUIRE(resolve("cuMemAlloc", 12000) == exported("cuMemAlloc_v2"));
  REQUIRE(resolve("cuMemAlloc", 3020) == exported("cuMemAlloc_v2"));
  REQUIRE(resolve("cuMemAlloc", 3010, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) == nullptr);
  REQUIRE(resolve("cuGetProcAddress", 12000) == exported("cuGetProcAddress_v2"));
  REQUIRE(resolve("cuGetProcAddress", 11030) == exported("cuGetProcAddress"));
  REQUIRE(resolve("cuMemcpyHtoDAsync", 13000) == exported("cuMemcpyHtoDAsync_v2"));
  REQUIRE(resolve("cuStreamDestroy", 13000) == exported("cuStreamDestroy_v2"));
  REQUIRE(resolve("cuDevicePrimaryCtxRelease", 13000) == exported("cuDevicePrimaryCtxRelease_v2"));
  REQUIRE(resolve("cuMemGetInfo", 13000) == exported("cuMemGetInfo_v2"));
  REQUIRE(resolve("cuCtxSynchronize", 12000) == exported("cuCtxSynchronize"));
  REQUIRE(resolve("cuCtxSynchronize", 13000) == exported("cuCtxSynchronize_v2"));
  REQUIRE(resolve("cuDeviceGetUuid", 11040) == exported("cuDeviceGetUuid_v2"));
  REQUIRE(resolve("cuMemCreate", 13000) == exported("cuMemCreate"));
  REQUIRE(resolve("cuStreamGetDevice", 12000, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) == nullptr);
  REQUIRE(resolve("cuNoSuchFunction", 13000, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) == nullptr);

  // Per-thread-default-stream lookups get the same functions (legacy semantics on the emulator).
  void* pt = nullptr;
  REQUIRE_CU(cuGetProcAddress_v2("cuMemcpyAsync", &pt, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  REQUIRE(pt == exported("cuMemcpyAsync"));

  // The 4-argument v1 resolver answers the same way.
  using v1_t = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = reinterpret_cast<v1_t>(exported("cuGetProcAddress"));
  REQUIRE(v1 != nullptr);
  void* fn = nullptr;
  REQUIRE(v1("cuMemFree", &fn, 12000, 0) == CUDA_SUCCESS);
  REQUIRE(fn == exported("cuMemFree_v2"));
  REQUIRE(v1("cuNoSuchFunction", &fn, 12000, 0) == CUDA_ERROR_NOT_FOUND);
  REQUIRE(fn == nullptr);

  // A real driver function the emulator does not implement resolves to a stub that says so.
  using launch_t = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void**, void**);
  auto launch = reinterpret_cast<launch_t>(resolve("cuLaunchKernel", 13000));
  REQUIRE(launch != nullptr);
  REQUIRE(launch(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) == CUDA_ERROR_NOT_SUPPORTED);
}

TEST_CASE("error names and strings", "[resolver]") {
  const char* s = nullptr;
  REQUIRE_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  REQUIRE(std::string(s) == "CUDA_ERROR_OUT_OF_MEMORY");
  REQUIRE_CU(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
  REQUIRE(std::string(s) == "invalid argument");
  REQUIRE_CU(cuGetErrorName(CUDA_ERROR_NOT_READY, &s));
  REQUIRE(std::string(s) == "CUDA_ERROR_NOT_READY");
  REQUIRE_CU(cuGetErrorString(CUDA_ERROR_LAUNCH_TIMEOUT, &s));  // a code the emulator never returns
  REQUIRE(s != nullptr);
  REQUIRE(cuGetErrorName(static_cast<CUresult>(123456), &s) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(s == nullptr);
}

TEST_CASE("the driver checkpoint API is its state machine, kept in the process", "[resolver][checkpoint]") {
  current_context();
  CUprocessState state{};
  REQUIRE_CU(cuCheckpointProcessGetState(getpid(), &state));
  REQUIRE(state == CU_PROCESS_STATE_RUNNING);
  REQUIRE(cuCheckpointProcessCheckpoint(getpid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);  // not locked
  REQUIRE(cuCheckpointProcessUnlock(getpid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE_CU(cuCheckpointProcessLock(getpid(), nullptr));
  REQUIRE_CU(cuCheckpointProcessGetState(getpid(), &state));
  REQUIRE(state == CU_PROCESS_STATE_LOCKED);
  REQUIRE(cuCheckpointProcessLock(getpid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE_CU(cuCheckpointProcessCheckpoint(getpid(), nullptr));
  REQUIRE_CU(cuCheckpointProcessGetState(getpid(), &state));
  REQUIRE(state == CU_PROCESS_STATE_CHECKPOINTED);
  REQUIRE(cuCheckpointProcessUnlock(getpid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);  // restore first
  REQUIRE_CU(cuCheckpointProcessRestore(getpid(), nullptr));
  REQUIRE_CU(cuCheckpointProcessUnlock(getpid(), nullptr));
  REQUIRE_CU(cuCheckpointProcessGetState(getpid(), &state));
  REQUIRE(state == CU_PROCESS_STATE_RUNNING);
  int tid = 0;
  REQUIRE_CU(cuCheckpointProcessGetRestoreThreadId(getpid(), &tid));
  // A process without the emulator (this one's parent, a shell or ctest) has no state to read.
  REQUIRE(cuCheckpointProcessGetState(1, &state) == CUDA_ERROR_INVALID_VALUE);
  void* fn = nullptr;
  REQUIRE_CU(cuGetProcAddress_v2("cuCheckpointProcessLock", &fn, 13000, 0, nullptr));
  REQUIRE(fn == dlsym(RTLD_DEFAULT, "cuCheckpointProcessLock"));
}
