// Emulator test program: the VMM API as NCCL's cuMem buffers call it, shared with another process.
//
// A reservation aligned to the granularity, one handle mapped at offset 0 with POSIX FD handles and the
// RDMA flag, exported by passing the handle as a raw uint64 (NCCL's proxy does), imported by a fresh
// process (this program again, under the shim) that reads the parent's bytes and writes its own back;
// then NCCL's way of freeing: retain on the pointer, release, unmap, release, free.
#include <cuda.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "vmm_support.hpp"

using namespace vmmckpt::programs;
using vmmckpt::contracts::print_ptr;

namespace {

constexpr int inherited_fd = 100;

// The importing process: maps the parent's memory in a reservation of its own and checks the bytes.
int importer(std::size_t size) {
  start_cuda();
  CUmemGenericAllocationHandle imported = 0;
  VMMCKPT_CHECK(cuMemImportFromShareableHandle(&imported,
                                               reinterpret_cast<void*>(static_cast<std::intptr_t>(inherited_fd)),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  // Another process's memory passes through: the driver's own handle, no token.
  std::printf("child imported a driver handle: %s\n", (imported >> 40) == 0x766d6d ? "no" : "yes");
  VMMCKPT_EXPECT((imported >> 40) != 0x766d6d);
  CUdeviceptr va = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
  print_ptr(va, size, "child-cuMemAddressReserve");
  VMMCKPT_CHECK(cuMemMap(va, size, 0, imported, 0));
  const CUmemAccessDesc rw = read_write(0);
  VMMCKPT_CHECK(cuMemSetAccess(va, size, &rw, 1));
  VMMCKPT_EXPECT(has_pattern(va, size, 7));
  write_pattern(va, size / 2, 8);
  VMMCKPT_CHECK(cuMemUnmap(va, size));
  VMMCKPT_CHECK(cuMemRelease(imported));
  VMMCKPT_CHECK(cuMemAddressFree(va, size));
  std::printf("child read the parent's bytes\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--import") return importer(std::strtoull(argv[2], nullptr, 0));
  start_cuda();
  const CUmemAllocationProp prop = device_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t gran = 0;
  VMMCKPT_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = (10u << 20) / gran * gran + gran;  // 10 MiB rounded up to the granularity
  CUdeviceptr ptr = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&ptr, size, gran, 0, 0));
  print_ptr(ptr, size, "cuMemAddressReserve");
  CUmemGenericAllocationHandle handle = 0;
  VMMCKPT_CHECK(cuMemCreate(&handle, size, &prop, 0));
  print_token(handle, "cuMemCreate");
  VMMCKPT_CHECK(cuMemMap(ptr, size, 0, handle, 0));
  const CUmemAccessDesc rw = read_write(0);
  VMMCKPT_CHECK(cuMemSetAccess(ptr, size, &rw, 1));
  write_pattern(ptr, size, 7);

  // The proxy thread gets the handle as raw bytes and exports that value.
  std::uint64_t raw = 0;
  std::memcpy(&raw, &handle, sizeof raw);
  int fd = -1;
  VMMCKPT_CHECK(cuMemExportToShareableHandle(&fd, static_cast<CUmemGenericAllocationHandle>(raw),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  VMMCKPT_EXPECT(fd >= 0);
  std::fflush(stdout);
  const pid_t child = fork();
  VMMCKPT_EXPECT(child >= 0);
  if (child == 0) {
    // A fresh process (under the shim again, LD_PRELOAD being inherited) with the descriptor.
    if (dup2(fd, inherited_fd) < 0) _exit(3);
    const std::string size_text = std::to_string(size);
    execl("/proc/self/exe", argv[0], "--import", size_text.c_str(), static_cast<char*>(nullptr));
    _exit(4);
  }
  int status = 0;
  VMMCKPT_EXPECT(waitpid(child, &status, 0) == child);
  VMMCKPT_EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fd);
  // Live bytes both ways: the child's half is here, the rest is the parent's own.
  VMMCKPT_EXPECT(has_pattern(ptr, size / 2, 8));
  std::printf("parent sees the child's bytes\n");

  // NCCL's free: retain on the pointer (and release that reference), then unmap, release, free.
  CUmemGenericAllocationHandle retained = 0;
  VMMCKPT_CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(ptr)));
  VMMCKPT_EXPECT(retained == handle);
  VMMCKPT_CHECK(cuMemRelease(retained));
  VMMCKPT_CHECK(cuMemUnmap(ptr, size));
  VMMCKPT_CHECK(cuMemRelease(handle));
  VMMCKPT_CHECK(cuMemAddressFree(ptr, size));
  std::printf("done\n");
  return 0;
}
