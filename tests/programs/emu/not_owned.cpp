// Emulator test program: device memory the shim does not own (managed, an array, a memory pool other processes can
// import) beside pool memory.
//
//   not_owned [managed] [array] [pool]
// Allocates 4 MiB of pool memory with a pattern and each kind named (all three when none is):
// managed 64 MiB, a 256 x 256 float4 array (1 MiB), 2 MiB from a memory pool it creates with POSIX FD handles
// (one the shim does not serve: its allocations could be imported by other processes). Prints
// `ready`, then waits: SIGUSR1 frees the memory the shim does not own (`freed`), SIGUSR2 checks the
// pool memory's pattern (`intact`) and exits 0.
#include <cuda.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>

#include "vmm_support.hpp"

using namespace vmmckpt::programs;

namespace {

volatile sig_atomic_t free_requested = 0;
volatile sig_atomic_t check_requested = 0;

void on_signal(int sig) {
  if (sig == SIGUSR1) free_requested = 1;
  if (sig == SIGUSR2) check_requested = 1;
}

constexpr std::size_t pool_bytes = 4u << 20;
constexpr unsigned seed = 77;

}  // namespace

int main(int argc, char** argv) {
  std::set<std::string> kinds(argv + 1, argv + argc);
  if (kinds.empty()) kinds = {"managed", "array", "pool"};
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGUSR2, &sa, nullptr);

  start_cuda();
  CUdeviceptr owned = 0;
  VMMCKPT_CHECK(cuMemAlloc(&owned, pool_bytes));
  write_pattern(owned, pool_bytes, seed);

  CUdeviceptr managed = 0;
  if (kinds.count("managed")) {
    VMMCKPT_CHECK(cuMemAllocManaged(&managed, 64u << 20, CU_MEM_ATTACH_GLOBAL));
    VMMCKPT_CHECK(cuMemsetD8(managed, 0x5a, 64u << 20));
  }
  CUarray array = nullptr;
  if (kinds.count("array")) {
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    desc.Width = 256;
    desc.Height = 256;
    desc.Format = CU_AD_FORMAT_FLOAT;
    desc.NumChannels = 4;
    VMMCKPT_CHECK(cuArray3DCreate(&array, &desc));
  }
  CUmemoryPool mem_pool = nullptr;
  CUdeviceptr from_pool = 0;
  if (kinds.count("pool")) {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    VMMCKPT_CHECK(cuMemPoolCreate(&mem_pool, &props));
    VMMCKPT_CHECK(cuMemAllocFromPoolAsync(&from_pool, 2u << 20, mem_pool, nullptr));
    VMMCKPT_CHECK(cuStreamSynchronize(nullptr));
  }
  std::printf("ready\n");
  std::fflush(stdout);

  for (;;) {
    if (free_requested) {
      free_requested = 0;
      if (managed != 0) VMMCKPT_CHECK(cuMemFree(managed));
      if (array != nullptr) VMMCKPT_CHECK(cuArrayDestroy(array));
      if (from_pool != 0) {
        VMMCKPT_CHECK(cuMemFreeAsync(from_pool, nullptr));
        VMMCKPT_CHECK(cuStreamSynchronize(nullptr));
        VMMCKPT_CHECK(cuMemPoolDestroy(mem_pool));
      }
      managed = from_pool = 0;
      array = nullptr;
      std::printf("freed\n");
      std::fflush(stdout);
    }
    if (check_requested) {
      const bool intact = has_pattern(owned, pool_bytes, seed);
      std::printf("%s\n", intact ? "intact" : "damaged");
      std::fflush(stdout);
      return intact ? 0 : 1;
    }
    usleep(10000);
  }
}
