// Emulator test program for copies between two devices: every driver copy form across devices, bytes checked,
// with and without peer access (tests/emu/peer_e2e_test.cpp; VMMCKPT_EMU_DEVICES=2).
//
// usage: emu_peer_copies codes          the return codes of enabling and disabling peer access, one per line
//        emu_peer_copies copies [--peer] one round of every copy form from each device's context; "copies ok"
//        emu_peer_copies serve          peer access on, a buffer on each device; "a0=ADDR a1=ADDR", "ready"; then a
//                                       round of copies at each SIGUSR1 ("round N ok"); SIGTERM ends it
//        emu_peer_copies restored A0 A1 the buffers of a restored `serve` image hold their pattern, and copy
//                                       between the devices without enabling peer access first ("restored ok")
// A failed copy prints "BAD FORM: error N" and exits 3.
#include <cuda.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/cuda_check.hpp"

namespace {

constexpr std::size_t buffer_size = 4 << 20;
constexpr std::size_t row = 1024;  // pitch of the 2D and 3D forms
constexpr std::size_t rows_per_layer = 64;

CUcontext ctx[2];

unsigned char pattern(std::size_t i, unsigned seed) { return static_cast<unsigned char>((i * 131 + seed * 17) & 0xff); }

std::vector<unsigned char> expected(unsigned seed) {
  std::vector<unsigned char> v(buffer_size);
  for (std::size_t i = 0; i < buffer_size; ++i) v[i] = pattern(i, seed);
  return v;
}

// The device's own context current for a scope.
struct on_device {
  explicit on_device(int device) { VMMCKPT_CHECK(cuCtxPushCurrent(ctx[device])); }
  ~on_device() {
    CUcontext popped;
    cuCtxPopCurrent(&popped);
  }
};

void fill(int device, CUdeviceptr p, unsigned seed) {
  on_device scope(device);
  const auto v = expected(seed);
  VMMCKPT_CHECK(cuMemcpyHtoD(p, v.data(), v.size()));
}

std::vector<unsigned char> read_back(int device, CUdeviceptr p) {
  on_device scope(device);
  std::vector<unsigned char> v(buffer_size);
  VMMCKPT_CHECK(cuMemcpyDtoH(v.data(), p, v.size()));
  return v;
}

void clear(int device, CUdeviceptr p) {
  on_device scope(device);
  VMMCKPT_CHECK(cuMemsetD8(p, 0, buffer_size));
}

[[noreturn]] void bad(const std::string& form, const std::string& what) {
  std::printf("BAD %s: %s\n", form.c_str(), what.c_str());
  std::fflush(stdout);
  std::exit(3);
}

void require_ok(const std::string& form, CUresult r) {
  if (r != CUDA_SUCCESS) bad(form, "error " + std::to_string(static_cast<int>(r)));
}

// dst (on dst_device) must hold `want` wherever `copied(i)` says the form wrote, and 0 elsewhere.
template <typename Copied>
void require_bytes(const std::string& form, int dst_device, CUdeviceptr dst, unsigned seed, Copied copied) {
  const auto got = read_back(dst_device, dst);
  for (std::size_t i = 0; i < buffer_size; ++i) {
    const unsigned char want = copied(i) ? pattern(i, seed) : 0;
    if (got[i] != want) bad(form, "byte " + std::to_string(i) + " is " + std::to_string(got[i]));
  }
}
void require_bytes(const std::string& form, int dst_device, CUdeviceptr dst, unsigned seed) {
  require_bytes(form, dst_device, dst, seed, [](std::size_t) { return true; });
}

CUDA_MEMCPY3D_PEER peer_3d(CUdeviceptr dst, int dst_device, CUdeviceptr src, int src_device) {
  CUDA_MEMCPY3D_PEER p{};
  p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = src;
  p.dstDevice = dst;
  p.srcContext = ctx[src_device];
  p.dstContext = ctx[dst_device];
  p.srcPitch = p.dstPitch = row;
  p.srcHeight = p.dstHeight = rows_per_layer;
  p.WidthInBytes = row - 24;  // a part of each row: the pitch is honoured
  p.Height = rows_per_layer;
  p.Depth = buffer_size / (row * rows_per_layer);
  return p;
}

bool in_rows(std::size_t i) { return i % row < row - 24; }

// Every form, src on device `from` to dst on device `to`, with device `current`'s context current.
void copy_round(CUdeviceptr buffer[2], CUdeviceptr scratch[2], int current) {
  void* peer_fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  VMMCKPT_CHECK(cuGetProcAddress("cuMemcpyPeer", &peer_fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  const auto resolved_peer = reinterpret_cast<decltype(&cuMemcpyPeer)>(peer_fn);
  on_device scope(current);
  CUstream stream;
  VMMCKPT_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  for (int from = 0; from < 2; ++from) {
    const int to = 1 - from;
    const unsigned seed = static_cast<unsigned>(from + 1);
    const CUdeviceptr src = buffer[from];
    const CUdeviceptr dst = scratch[to];
    const std::string dir =
        " from device " + std::to_string(from) + " (context of device " + std::to_string(current) + ")";
    auto each = [&](const std::string& form, auto&& copy) {
      clear(to, dst);
      require_ok(form + dir, copy());
      require_ok(form + dir + " sync", cuStreamSynchronize(stream));
      require_ok(form + dir + " ctx sync", cuCtxSynchronize());
    };
    each("cuMemcpy", [&] { return cuMemcpy(dst, src, buffer_size); });
    require_bytes("cuMemcpy" + dir, to, dst, seed);
    each("cuMemcpyAsync", [&] { return cuMemcpyAsync(dst, src, buffer_size, stream); });
    require_bytes("cuMemcpyAsync" + dir, to, dst, seed);
    each("cuMemcpyDtoD", [&] { return cuMemcpyDtoD(dst, src, buffer_size); });
    require_bytes("cuMemcpyDtoD" + dir, to, dst, seed);
    each("cuMemcpyDtoDAsync", [&] { return cuMemcpyDtoDAsync(dst, src, buffer_size, stream); });
    require_bytes("cuMemcpyDtoDAsync" + dir, to, dst, seed);
    each("cuMemcpyPeer", [&] { return cuMemcpyPeer(dst, ctx[to], src, ctx[from], buffer_size); });
    require_bytes("cuMemcpyPeer" + dir, to, dst, seed);
    each("cuMemcpyPeer (cuGetProcAddress)", [&] { return resolved_peer(dst, ctx[to], src, ctx[from], buffer_size); });
    require_bytes("cuMemcpyPeer (cuGetProcAddress)" + dir, to, dst, seed);
    each("cuMemcpyPeerAsync", [&] { return cuMemcpyPeerAsync(dst, ctx[to], src, ctx[from], buffer_size, stream); });
    require_bytes("cuMemcpyPeerAsync" + dir, to, dst, seed);
    each("cuMemcpy2D", [&] {
      CUDA_MEMCPY2D p{};
      p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
      p.srcDevice = src;
      p.dstDevice = dst;
      p.srcPitch = p.dstPitch = row;
      p.WidthInBytes = row - 24;
      p.Height = buffer_size / row;
      return cuMemcpy2D(&p);
    });
    require_bytes("cuMemcpy2D" + dir, to, dst, seed, in_rows);
    each("cuMemcpy3D", [&] {
      const CUDA_MEMCPY3D_PEER peer = peer_3d(dst, to, src, from);
      CUDA_MEMCPY3D p{};
      p.srcMemoryType = p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
      p.srcDevice = src;
      p.dstDevice = dst;
      p.srcPitch = p.dstPitch = row;
      p.srcHeight = p.dstHeight = rows_per_layer;
      p.WidthInBytes = peer.WidthInBytes;
      p.Height = peer.Height;
      p.Depth = peer.Depth;
      return cuMemcpy3D(&p);
    });
    require_bytes("cuMemcpy3D" + dir, to, dst, seed, in_rows);
    each("cuMemcpy3DPeer", [&] {
      const CUDA_MEMCPY3D_PEER p = peer_3d(dst, to, src, from);
      return cuMemcpy3DPeer(&p);
    });
    require_bytes("cuMemcpy3DPeer" + dir, to, dst, seed, in_rows);
    each("cuMemcpy3DPeerAsync", [&] {
      const CUDA_MEMCPY3D_PEER p = peer_3d(dst, to, src, from);
      return cuMemcpy3DPeerAsync(&p, stream);
    });
    require_bytes("cuMemcpy3DPeerAsync" + dir, to, dst, seed, in_rows);
    // Device memory of another device to and from the host, from this context.
    std::vector<unsigned char> host(buffer_size);
    require_ok("cuMemcpyDtoH" + dir, cuMemcpyDtoH(host.data(), src, buffer_size));
    if (host != expected(seed)) bad("cuMemcpyDtoH" + dir, "wrong bytes");
    clear(to, dst);
    require_ok("cuMemcpyHtoD" + dir, cuMemcpyHtoD(dst, host.data(), buffer_size));
    require_bytes("cuMemcpyHtoD" + dir, to, dst, seed);
  }
  VMMCKPT_CHECK(cuStreamDestroy(stream));
}

void start(bool peer) {
  VMMCKPT_CHECK(cuInit(0));
  int count = 0;
  VMMCKPT_CHECK(cuDeviceGetCount(&count));
  VMMCKPT_EXPECT(count >= 2);
  for (int d = 0; d < 2; ++d) {
    CUdevice dev;
    VMMCKPT_CHECK(cuDeviceGet(&dev, d));
    VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx[d], dev));
  }
  if (!peer) return;
  // One direction by the exported name, the other as cudart asks for it: through cuGetProcAddress.
  {
    on_device scope(0);
    VMMCKPT_CHECK(cuCtxEnablePeerAccess(ctx[1], 0));
  }
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  VMMCKPT_CHECK(cuGetProcAddress("cuCtxEnablePeerAccess", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  on_device scope(1);
  VMMCKPT_CHECK(reinterpret_cast<decltype(&cuCtxEnablePeerAccess)>(fn)(ctx[0], 0));
}

CUdeviceptr allocate(int device) {
  on_device scope(device);
  CUdeviceptr p = 0;
  VMMCKPT_CHECK(cuMemAlloc(&p, buffer_size));
  return p;
}

void make_buffers(CUdeviceptr buffer[2], CUdeviceptr scratch[2]) {
  for (int d = 0; d < 2; ++d) {
    buffer[d] = allocate(d);
    scratch[d] = allocate(d);
    fill(d, buffer[d], static_cast<unsigned>(d + 1));
  }
}

void require_patterns(CUdeviceptr buffer[2]) {
  for (int d = 0; d < 2; ++d)
    if (read_back(d, buffer[d]) != expected(static_cast<unsigned>(d + 1)))
      bad("buffer of device " + std::to_string(d), "lost its pattern");
}

void print_code(const char* what, CUresult r) { std::printf("%s=%d\n", what, static_cast<int>(r)); }

int codes() {
  start(false);
  int can = -1;
  VMMCKPT_CHECK(cuDeviceCanAccessPeer(&can, 0, 1));
  std::printf("can_access_0_1=%d\n", can);
  VMMCKPT_CHECK(cuDeviceCanAccessPeer(&can, 0, 0));
  std::printf("can_access_0_0=%d\n", can);
  CUcontext same_device;
  CUdevice dev0;
  VMMCKPT_CHECK(cuDeviceGet(&dev0, 0));
  on_device scope(0);
  print_code("enable_flags", cuCtxEnablePeerAccess(ctx[1], 1));
  print_code("enable_self", cuCtxEnablePeerAccess(ctx[0], 0));
  print_code("enable_null", cuCtxEnablePeerAccess(nullptr, 0));
  print_code("disable_not_enabled", cuCtxDisablePeerAccess(ctx[1]));
  print_code("enable", cuCtxEnablePeerAccess(ctx[1], 0));
  print_code("enable_twice", cuCtxEnablePeerAccess(ctx[1], 0));
  print_code("disable", cuCtxDisablePeerAccess(ctx[1]));
  print_code("disable_twice", cuCtxDisablePeerAccess(ctx[1]));
  print_code("enable_again", cuCtxEnablePeerAccess(ctx[1], 0));
  VMMCKPT_CHECK(cuCtxCreate(&same_device, nullptr, 0, dev0));  // current now; ctx[0] is below it
  print_code("enable_same_device", cuCtxEnablePeerAccess(ctx[0], 0));
  VMMCKPT_CHECK(cuCtxDestroy(same_device));
  return 0;
}

int copies(bool peer) {
  start(peer);
  CUdeviceptr buffer[2], scratch[2];
  make_buffers(buffer, scratch);
  for (int current = 0; current < 2; ++current) copy_round(buffer, scratch, current);
  require_patterns(buffer);
  std::printf("copies ok\n");
  return 0;
}

int serve() {
  sigset_t wanted;
  sigemptyset(&wanted);
  sigaddset(&wanted, SIGUSR1);
  sigaddset(&wanted, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &wanted, nullptr);
  start(true);
  CUdeviceptr buffer[2], scratch[2];
  make_buffers(buffer, scratch);
  std::printf("a0=%llu a1=%llu\nready\n", static_cast<unsigned long long>(buffer[0]),
              static_cast<unsigned long long>(buffer[1]));
  std::fflush(stdout);
  for (int round = 1;; ++round) {
    int sig = 0;
    sigwait(&wanted, &sig);
    if (sig == SIGTERM) return 0;
    require_patterns(buffer);
    for (int current = 0; current < 2; ++current) copy_round(buffer, scratch, current);
    std::printf("round %d ok\n", round);
    std::fflush(stdout);
  }
}

int restored(CUdeviceptr a0, CUdeviceptr a1) {
  start(false);
  CUdeviceptr buffer[2] = {a0, a1};
  require_patterns(buffer);
  CUdeviceptr scratch[2] = {allocate(0), allocate(1)};
  for (int current = 0; current < 2; ++current) copy_round(buffer, scratch, current);
  std::printf("restored ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "codes") return codes();
  if (mode == "copies") return copies(argc > 2 && std::strcmp(argv[2], "--peer") == 0);
  if (mode == "serve") return serve();
  if (mode == "restored" && argc == 4)
    return restored(std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10));
  std::fprintf(stderr, "usage: emu_peer_copies codes | copies [--peer] | serve | restored A0 A1\n");
  return 2;
}
