// Emulator test program: fork() before and after CUDA use, while another thread allocates.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"

using vmmckpt::contracts::print_ptr;

namespace {

CUdeviceptr init_and_allocate(size_t size) {
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr p = 0;
  VMMCKPT_CHECK(cuMemAlloc(&p, size));
  return p;
}

int wait_child(pid_t pid) {
  int status = 0;
  VMMCKPT_EXPECT(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  VMMCKPT_EXPECT(argc == 2);
  if (std::strcmp(argv[1], "before-cuda") == 0) {
    // A child of a process that never touched CUDA uses the pool normally.
    const pid_t pid = fork();
    if (pid == 0) {
      const CUdeviceptr p = init_and_allocate(1000);
      print_ptr(p, 1000, "child:cuMemAlloc");
      std::fflush(stdout);
      _exit(0);
    }
    VMMCKPT_EXPECT(wait_child(pid) == 0);
    const CUdeviceptr p = init_and_allocate(1000);
    print_ptr(p, 1000, "parent:cuMemAlloc");
    std::printf("done\n");
    return 0;
  }

  if (std::strcmp(argv[1], "child-exits") == 0) {
    // A child that ends through exit(), running the atexit handlers it inherited, must leave the
    // parent's control socket alone: the parent stays reachable by cuda-ckpt.
    const CUdeviceptr p = init_and_allocate(4096);
    print_ptr(p, 4096, "parent:cuMemAlloc");
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) std::exit(0);
    VMMCKPT_EXPECT(wait_child(pid) == 0);
    std::printf("ready\n");
    std::fflush(stdout);
    sleep(60);
    return 0;
  }

  VMMCKPT_EXPECT(std::strcmp(argv[1], "after-cuda") == 0);
  const CUdeviceptr first = init_and_allocate(4096);
  print_ptr(first, 4096, "parent:cuMemAlloc");
  CUcontext ctx;
  VMMCKPT_CHECK(cuCtxGetCurrent(&ctx));

  // Another thread keeps the pool's locks busy while we fork.
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
    while (!stop) {
      CUdeviceptr p = 0;
      VMMCKPT_CHECK(cuMemAlloc(&p, 1 << 16));
      VMMCKPT_CHECK(cuMemFree(p));
    }
  });
  for (int i = 0; i < 20; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      // The child may not use the parent's GPU state; the shim must neither
      // hang nor crash here, whatever the driver answers.
      CUdeviceptr p = 0;
      const CUresult r = cuMemAlloc(&p, 100);
      std::printf("child %d cuMemAlloc -> %d\n", i, static_cast<int>(r));
      std::fflush(stdout);
      _exit(0);
    }
    VMMCKPT_EXPECT(wait_child(pid) == 0);
  }
  stop = true;
  churn.join();
  CUdeviceptr later = 0;
  VMMCKPT_CHECK(cuMemAlloc(&later, 4096));
  print_ptr(later, 4096, "parent:cuMemAlloc");
  std::printf("done\n");
  return 0;
}
