// Test program for legacy CUDA IPC under the shim: an exporter and an importer of pool memory, driver API.
//
// usage: emu_ipc_pair export DIR   allocates A (8 MiB, words 0xabcd1234), B (4 MiB, freed once exported) and C
//                                  (256 KiB, a small block sharing its physical memory, words 0x11111111); writes
//                                  their handles to DIR/handles; prints the codes of the refusals it meets and
//                                  "ready". SIGUSR1 prints A's first word ("a0 XXXXXXXX"); SIGTERM ends it.
//        emu_ipc_pair import DIR   opens the handles every way the driver answers (codes printed "name: N"),
//                                  writes 0x600dcafe into A's first word, holds A open ("holding"); SIGUSR1
//                                  closes it ("closed"); SIGTERM ends it.
//        emu_ipc_pair open DIR     opens A's handle once and prints "open: N".
// Codes are CUresult values: what NVIDIA's driver answers, measured on an H100 (docs/ipc.md).
#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/cuda_check.hpp"

namespace {

std::atomic<int> g_usr1{0};
std::atomic<bool> g_term{false};

void on_signal(int sig) {
  if (sig == SIGUSR1) g_usr1.fetch_add(1);
  if (sig == SIGTERM) g_term.store(true);
}

void say(const char* name, CUresult r) { std::printf("%s: %d\n", name, static_cast<int>(r)); }

void setup() {
  VMMCKPT_CHECK(cuInit(0));
  CUdevice device;
  VMMCKPT_CHECK(cuDeviceGet(&device, 0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  signal(SIGUSR1, on_signal);
  signal(SIGTERM, on_signal);
}

// Waits for the next SIGUSR1; false when SIGTERM came instead.
bool wait_usr1(int& seen) {
  while (!g_term.load()) {
    if (g_usr1.load() > seen) {
      seen = g_usr1.load();
      return true;
    }
    usleep(10'000);
  }
  return false;
}

struct handles {
  CUipcMemHandle a, a_interior, b, c;
};

std::uint32_t first_word(CUdeviceptr p) {
  std::uint32_t v = 0;
  VMMCKPT_CHECK(cuMemcpyDtoH(&v, p, sizeof v));
  return v;
}

int exporter(const std::string& dir) {
  setup();
  CUdeviceptr a, b, c;
  VMMCKPT_CHECK(cuMemAlloc(&a, 8 << 20));
  VMMCKPT_CHECK(cuMemAlloc(&b, 4 << 20));
  VMMCKPT_CHECK(cuMemAlloc(&c, 256 << 10));
  VMMCKPT_CHECK(cuMemsetD32(a, 0xabcd1234u, (8 << 20) / 4));
  VMMCKPT_CHECK(cuMemsetD32(c, 0x11111111u, (256 << 10) / 4));
  VMMCKPT_CHECK(cuCtxSynchronize());
  handles h{};
  VMMCKPT_CHECK(cuIpcGetMemHandle(&h.a, a));
  VMMCKPT_CHECK(cuIpcGetMemHandle(&h.a_interior, a + 4096));
  VMMCKPT_CHECK(cuIpcGetMemHandle(&h.b, b));
  VMMCKPT_CHECK(cuIpcGetMemHandle(&h.c, c));
  std::printf("interior handle equals base handle: %d\n", std::memcmp(&h.a, &h.a_interior, sizeof h.a) == 0);
  int host = 0;
  CUipcMemHandle ignored;
  say("get_host", cuIpcGetMemHandle(&ignored, reinterpret_cast<CUdeviceptr>(&host)));
  say("get_null_handle", cuIpcGetMemHandle(nullptr, a));
  CUdeviceptr self = 0;
  say("open_own", cuIpcOpenMemHandle(&self, h.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  {
    std::ofstream out(dir + "/handles.tmp", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
  }
  std::rename((dir + "/handles.tmp").c_str(), (dir + "/handles").c_str());
  VMMCKPT_CHECK(cuMemFree(b));  // its handle is stale from here
  std::printf("ready\n");
  std::fflush(stdout);
  int seen = 0;
  while (wait_usr1(seen)) {
    std::printf("a0 %08x\n", first_word(a));
    std::fflush(stdout);
  }
  return 0;
}

handles read_handles(const std::string& dir) {
  handles h{};
  std::ifstream in(dir + "/handles", std::ios::binary);
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  VMMCKPT_EXPECT(in.gcount() == sizeof h);
  return h;
}

int importer(const std::string& dir) {
  setup();
  const handles h = read_handles(dir);
  CUdeviceptr p1 = 0, p2 = 0, p = 0;
  VMMCKPT_CHECK(cuIpcOpenMemHandle(&p1, h.a_interior, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  std::printf("interior handle opens at the base: %d\n", first_word(p1) == 0xabcd1234u);
  VMMCKPT_CHECK(cuIpcOpenMemHandle(&p2, h.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  std::printf("second open, same pointer: %d\n", p1 == p2);
  std::uint32_t last = 0;
  VMMCKPT_CHECK(cuMemcpyDtoH(&last, p1 + (8 << 20) - 4, 4));
  std::printf("last word: %08x\n", last);
  VMMCKPT_CHECK(cuMemsetD32(p1, 0x600dcafeu, 1));
  VMMCKPT_CHECK(cuCtxSynchronize());
  CUdeviceptr pc = 0;
  VMMCKPT_CHECK(cuIpcOpenMemHandle(&pc, h.c, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  std::printf("small block: %08x\n", first_word(pc));
  VMMCKPT_CHECK(cuIpcCloseMemHandle(pc));
  say("open_freed", cuIpcOpenMemHandle(&p, h.b, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CUipcMemHandle junk;
  std::memset(&junk, 0x5a, sizeof junk);
  say("open_junk", cuIpcOpenMemHandle(&p, junk, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  say("open_flags_0", cuIpcOpenMemHandle(&p, h.a, 0));
  say("open_null_out", cuIpcOpenMemHandle(nullptr, h.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  say("close_interior", cuIpcCloseMemHandle(p1 + 4096));
  say("close_1", cuIpcCloseMemHandle(p1));
  say("close_2", cuIpcCloseMemHandle(p2));
  say("close_3", cuIpcCloseMemHandle(p2));
  // Opened by four threads at once: one mapping, four references, each closed.
  {
    CUcontext ctx = nullptr;
    VMMCKPT_CHECK(cuCtxGetCurrent(&ctx));
    CUdeviceptr got[4] = {};
    CUresult opened[4] = {};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
      threads.emplace_back([&, i] {
        cuCtxSetCurrent(ctx);
        opened[i] = cuIpcOpenMemHandle(&got[i], h.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      });
    for (auto& t : threads) t.join();
    bool same = true;
    for (int i = 0; i < 4; ++i) same = same && opened[i] == CUDA_SUCCESS && got[i] == got[0];
    std::printf("four threads, one pointer: %d\n", same);
    int closed = 0;
    for (int i = 0; i < 4; ++i) closed += cuIpcCloseMemHandle(got[0]) == CUDA_SUCCESS;
    std::printf("four closes: %d, a fifth: %d\n", closed, static_cast<int>(cuIpcCloseMemHandle(got[0])));
  }
  CUdeviceptr own = 0;
  VMMCKPT_CHECK(cuMemAlloc(&own, 4096));
  say("close_not_imported", cuIpcCloseMemHandle(own));
  CUdeviceptr held = 0;
  VMMCKPT_CHECK(cuIpcOpenMemHandle(&held, h.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  std::printf("holding %08x\n", first_word(held));
  std::fflush(stdout);
  int seen = 0;
  if (wait_usr1(seen)) {
    VMMCKPT_CHECK(cuIpcCloseMemHandle(held));
    std::printf("closed\n");
    std::fflush(stdout);
    wait_usr1(seen);
  }
  return 0;
}

int open_once(const std::string& dir) {
  setup();
  const handles h = read_handles(dir);
  CUdeviceptr p = 0;
  say("open", cuIpcOpenMemHandle(&p, h.a, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 3 && std::strcmp(argv[1], "export") == 0) return exporter(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "import") == 0) return importer(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "open") == 0) return open_once(argv[2]);
  std::fprintf(stderr, "usage: emu_ipc_pair export|import|open DIR\n");
  return 2;
}
