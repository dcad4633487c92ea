// Tests of native allocations, pinned memory, copies and memsets, and pointer validation.
#include "emu_test_support.hpp"

#include <cstring>
#include <vector>

using namespace emu_test;

TEST_CASE("native allocations are counted and placed outside the shim's pool area", "[memory]") {
  current_context();
  std::size_t free0 = 0, total = 0;
  REQUIRE_CU(cuMemGetInfo(&free0, &total));
  CUdeviceptr p = 0;
  REQUIRE_CU(cuMemAlloc(&p, 3 << 20));
  REQUIRE(p % 256 == 0);
  REQUIRE((p < 0x200000000000ULL || p >= 0x300000000000ULL));
  std::size_t free1 = 0;
  REQUIRE_CU(cuMemGetInfo(&free1, &total));
  REQUIRE(free0 - free1 == std::size_t{3} << 20);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  REQUIRE_CU(cuMemGetAddressRange(&base, &size, p + 12345));
  REQUIRE(base == p);
  REQUIRE(size == std::size_t{3} << 20);
  REQUIRE(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(cuMemFree(base));
  REQUIRE(cuMemFree(base) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(cuMemGetInfo(&free1, &total));
  REQUIRE(free1 == free0);

  CUdeviceptr pitched = 0;
  std::size_t pitch = 0;
  REQUIRE_CU(cuMemAllocPitch(&pitched, &pitch, 1000, 10, 4));
  REQUIRE(pitch == 1024);
  REQUIRE(cuMemAllocPitch(&pitched, &pitch, 1000, 10, 3) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(cuMemFree(pitched));
}

TEST_CASE("copies and memsets move bytes and refuse bad device pointers", "[memory]") {
  current_context();
  CUdeviceptr a = 0, b = 0;
  REQUIRE_CU(cuMemAlloc(&a, 1024));
  REQUIRE_CU(cuMemAlloc(&b, 1024));
  std::vector<unsigned char> host(1024);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7);
  REQUIRE_CU(cuMemcpyHtoD(a, host.data(), host.size()));
  REQUIRE_CU(cuMemcpyDtoD(b, a, 1024));
  std::vector<unsigned char> back(1024);
  REQUIRE_CU(cuMemcpyDtoH(back.data(), b, 1024));
  REQUIRE(back == host);
  REQUIRE_CU(cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), a, 16));  // unified addressing

  REQUIRE_CU(cuMemsetD32(a, 0xdeadbeef, 256));
  REQUIRE(reinterpret_cast<unsigned*>(a)[255] == 0xdeadbeef);
  REQUIRE_CU(cuMemsetD8(a, 0x11, 3));
  REQUIRE(reinterpret_cast<unsigned*>(a)[0] == 0xde111111);
  REQUIRE_CU(cuMemsetD16(a, 0x2222, 2));
  REQUIRE(cuMemsetD32(a + 1, 0, 4) == CUDA_ERROR_INVALID_VALUE);  // misaligned

  // Past the end, into memory the emulator does not know, or a null pointer: refused, not crashed.
  REQUIRE(cuMemcpyHtoD(a + 1000, host.data(), 100) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(back.data()), host.data(), 4) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemsetD8(0, 0, 1) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemcpyDtoH(back.data(), 0, 1) == CUDA_ERROR_INVALID_VALUE);

  // 2D copy with pitches.
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = host.data();
  c.srcPitch = 32;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = b;
  c.dstPitch = 64;
  c.WidthInBytes = 16;
  c.Height = 4;
  REQUIRE_CU(cuMemsetD8(b, 0, 1024));
  REQUIRE_CU(cuMemcpy2D(&c));
  REQUIRE(reinterpret_cast<unsigned char*>(b)[64 * 3 + 15] == host[32 * 3 + 15]);
  REQUIRE(reinterpret_cast<unsigned char*>(b)[64 * 3 + 16] == 0);

  REQUIRE_CU(cuMemFree(a));
  REQUIRE_CU(cuMemFree(b));
}

TEST_CASE("pinned and registered host memory", "[memory]") {
  current_context();
  void* pinned = nullptr;
  REQUIRE_CU(cuMemHostAlloc(&pinned, 8192, CU_MEMHOSTALLOC_PORTABLE));
  unsigned flags = 0;
  REQUIRE_CU(cuMemHostGetFlags(&flags, pinned));
  REQUIRE(flags == CU_MEMHOSTALLOC_PORTABLE);
  CUdeviceptr as_device = 0;
  REQUIRE_CU(cuMemHostGetDevicePointer(&as_device, pinned, 0));
  REQUIRE(as_device == reinterpret_cast<CUdeviceptr>(pinned));
  unsigned type = 0;
  REQUIRE_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, as_device));
  REQUIRE(type == CU_MEMORYTYPE_HOST);
  REQUIRE_CU(cuMemFreeHost(pinned));

  std::vector<char> buf(4096);
  REQUIRE_CU(cuMemHostRegister(buf.data(), buf.size(), 0));
  REQUIRE(cuMemHostRegister(buf.data(), 16, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  REQUIRE_CU(cuMemHostUnregister(buf.data()));
  REQUIRE(cuMemHostUnregister(buf.data()) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);

  CUdeviceptr d = 0;
  REQUIRE_CU(cuMemAlloc(&d, 64));
  REQUIRE_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d));
  REQUIRE(type == CU_MEMORYTYPE_DEVICE);
  int ordinal = -1;
  REQUIRE_CU(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d));
  REQUIRE(ordinal == 0);
  REQUIRE_CU(cuMemFree(d));
}
