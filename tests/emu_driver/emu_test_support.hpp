// Helpers shared by the emulator's tests: error checks, a current context, and child processes.
#pragma once

#include <cuda.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>

#include <catch2/catch.hpp>

#define REQUIRE_CU(call) REQUIRE((call) == CUDA_SUCCESS)

namespace emu_test {

inline constexpr std::size_t granularity = std::size_t{2} << 20;

// Like current_context() but without Catch assertions, for threads other than the test's own
// (Catch's assertion macros are not thread-safe).
inline bool make_context_current_quietly() {
  CUcontext ctx = nullptr;
  return cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
         cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

// cuInit + primary context of device 0 made current on the calling thread (once per thread).
inline CUcontext current_context() {
  thread_local CUcontext ctx = nullptr;
  if (ctx == nullptr) {
    REQUIRE(cuInit(0) == CUDA_SUCCESS);
    REQUIRE(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
  }
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return ctx;
}

// A property for device `dev` whose handles are exportable as POSIX file descriptors.
inline CUmemAllocationProp exportable_prop(int dev = 0) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

inline CUmemAccessDesc read_write(int dev = 0) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = dev;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

// Runs `body` in a forked child and returns its wait status. The child restores the default
// SIGSEGV action first, so a fault kills it instead of reaching Catch's handler.
inline int run_in_child(const std::function<void()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);
    std::signal(SIGBUS, SIG_DFL);
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

inline bool died_of(int status, int sig) { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }

}  // namespace emu_test
