// Emulator test program: the VMM API as vLLM's sleep mode (and torch_memory_saver) call it.
//
// Each buffer: cuMemAddressReserve(size, 0, 0, 0), cuMemCreate with no handle type and the RDMA flag,
// mapped at offset 0. sleep() copies the bytes out, unmaps and releases, and keeps the reservation;
// wake_up() creates and maps again at the same address and copies the bytes back.
#include <cuda.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "vmm_support.hpp"

using namespace vmmckpt::programs;
using vmmckpt::contracts::print_ptr;

namespace {

struct buffer {
  CUdeviceptr va = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  std::vector<unsigned char> saved;
};

void back(buffer& b, const CUmemAllocationProp& prop) {
  VMMCKPT_CHECK(cuMemCreate(&b.handle, b.size, &prop, 0));
  print_token(b.handle, "cuMemCreate");
  VMMCKPT_CHECK(cuMemMap(b.va, b.size, 0, b.handle, 0));
  const CUmemAccessDesc rw = read_write(0);
  VMMCKPT_CHECK(cuMemSetAccess(b.va, b.size, &rw, 1));
}

// The window's first range is taken before CUDA starts: the reservation must fail, never move.
int window_taken() {
  const char* base_text = std::getenv("VMMCKPT_VMM_BASE");
  const unsigned long long base = base_text ? std::strtoull(base_text, nullptr, 0) : 0x300000000000ULL;
  void* taken = mmap(reinterpret_cast<void*>(base), 2 << 20, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  VMMCKPT_EXPECT(taken == reinterpret_cast<void*>(base));
  start_cuda();
  CUdeviceptr va = 0;
  const CUresult e = cuMemAddressReserve(&va, 64u << 20, 0, 0, 0);
  std::printf("result %s\n", error_name(e));
  VMMCKPT_EXPECT(e == CUDA_ERROR_OUT_OF_MEMORY);
  std::printf("done\n");
  return 0;
}

// A forked child after VMM use: the shim steps aside there (the parent's tokens are not the child's), so
// its calls reach the driver as they are, which refuses CUDA in a forked child as the real one does. A
// shim still serving would answer the release of the parent's token itself, with success.
int forked() {
  start_cuda();
  CUdeviceptr va = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&va, 2u << 20, 0, 0, 0));
  print_ptr(va, 2u << 20, "cuMemAddressReserve");
  const CUmemAllocationProp prop = device_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  CUmemGenericAllocationHandle handle = 0;
  VMMCKPT_CHECK(cuMemCreate(&handle, 2u << 20, &prop, 0));
  print_token(handle, "cuMemCreate");
  std::fflush(stdout);
  const pid_t child = fork();
  VMMCKPT_EXPECT(child >= 0);
  if (child == 0) {
    const CUresult e = cuMemRelease(handle);
    std::printf("child release of the parent's token: %s\n", error_name(e));
    std::fflush(stdout);
    _exit(e == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1);
  }
  int status = 0;
  VMMCKPT_EXPECT(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  VMMCKPT_CHECK(cuMemRelease(handle));  // the parent's own token is still its own
  VMMCKPT_CHECK(cuMemAddressFree(va, 2u << 20));
  std::printf("done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--window-taken") return window_taken();
  if (argc == 2 && std::string(argv[1]) == "--fork") return forked();
  start_cuda();
  const CUmemAllocationProp prop = device_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  size_t gran = 0;
  VMMCKPT_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  std::vector<buffer> buffers(3);
  const size_t sizes[] = {64u << 20, 6u << 20, 30u << 20};
  for (size_t i = 0; i < buffers.size(); ++i) {
    buffer& b = buffers[i];
    b.size = (sizes[i] + gran - 1) / gran * gran;
    VMMCKPT_CHECK(cuMemAddressReserve(&b.va, b.size, 0, 0, 0));
    print_ptr(b.va, b.size, "cuMemAddressReserve");
    back(b, prop);
    write_pattern(b.va, b.size, 50 + static_cast<unsigned>(i));
  }
  size_t free_awake = 0, total = 0;
  VMMCKPT_CHECK(cuMemGetInfo(&free_awake, &total));

  for (int cycle = 0; cycle < 2; ++cycle) {
    // sleep(): the bytes out, the memory back to the driver, the addresses kept.
    VMMCKPT_CHECK(cuCtxSynchronize());
    for (buffer& b : buffers) {
      b.saved.resize(b.size);
      VMMCKPT_CHECK(cuMemcpyDtoH(b.saved.data(), b.va, b.size));
      VMMCKPT_CHECK(cuMemUnmap(b.va, b.size));
      VMMCKPT_CHECK(cuMemRelease(b.handle));
    }
    size_t free_asleep = 0;
    VMMCKPT_CHECK(cuMemGetInfo(&free_asleep, &total));
    VMMCKPT_EXPECT(free_asleep > free_awake);
    // wake_up(): new memory at the same addresses, the bytes back.
    for (buffer& b : buffers) {
      back(b, prop);
      VMMCKPT_CHECK(cuMemcpyHtoD(b.va, b.saved.data(), b.size));
    }
    for (size_t i = 0; i < buffers.size(); ++i)
      VMMCKPT_EXPECT(has_pattern(buffers[i].va, buffers[i].size, 50 + static_cast<unsigned>(i)));
    std::printf("cycle %d: woke up at the same addresses\n", cycle);
  }
  for (buffer& b : buffers) {
    VMMCKPT_CHECK(cuMemUnmap(b.va, b.size));
    VMMCKPT_CHECK(cuMemRelease(b.handle));
    VMMCKPT_CHECK(cuMemAddressFree(b.va, b.size));
  }
  std::printf("done\n");
  return 0;
}
