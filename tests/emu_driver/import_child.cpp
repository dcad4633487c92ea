// Helper process for the cross-process test: receives a physical-memory fd over a Unix socket,
// imports it, maps it at the owner's address, and checks that writes are visible both ways, live.
#include <cuda.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "import_child: %s\n", what);
  return 1;
}

int receive_fd(int sock) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (recvmsg(sock, &msg, 0) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return fail("usage: import_child SOCK ADDR SIZE");
  const int sock = std::atoi(argv[1]);
  const CUdeviceptr want = std::strtoull(argv[2], nullptr, 10);
  const std::size_t size = std::strtoull(argv[3], nullptr, 10);
  const int fd = receive_fd(sock);
  if (fd < 0) return fail("no descriptor received");

  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    return fail("init");
  }
  CUdeviceptr va = 0;
  if (cuMemAddressReserve(&va, size, 0, want, 0) != CUDA_SUCCESS || va != want)
    return fail("reserve at the owner's address");
  CUmemGenericAllocationHandle h = 0;
  if (cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS) {
    return fail("import");
  }
  close(fd);
  CUmemAllocationProp prop{};
  if (cuMemGetAllocationPropertiesFromHandle(&prop, h) != CUDA_SUCCESS || prop.location.id != 0)
    return fail("properties");
  if (cuMemMap(va, size, 0, h, 0) != CUDA_SUCCESS) return fail("map");
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cuMemSetAccess(va, size, &desc, 1) != CUDA_SUCCESS) return fail("access");

  auto* bytes = reinterpret_cast<volatile char*>(va);
  if (bytes[0] != 'A' || bytes[4095] != 'A') return fail("owner's bytes not visible");
  // Also through the driver's copy path.
  char copy[4] = {};
  if (cuMemcpyDtoH(copy, va, sizeof copy) != CUDA_SUCCESS || copy[3] != 'A') return fail("copy out");
  if (write(sock, "1", 1) != 1) return fail("write 1");
  char b = 0;
  if (read(sock, &b, 1) != 1 || b != '2') return fail("read 2");
  if (bytes[10] != 'B') return fail("live write of the owner not visible");
  bytes[100] = 'C';
  if (write(sock, "3", 1) != 1) return fail("write 3");

  if (cuMemUnmap(va, size) != CUDA_SUCCESS || cuMemRelease(h) != CUDA_SUCCESS ||
      cuMemAddressFree(va, size) != CUDA_SUCCESS) {
    return fail("teardown");
  }
  return 0;
}
