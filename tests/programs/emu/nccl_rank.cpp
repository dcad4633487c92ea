// Emulator test program: the memory an NCCL rank maps itself, with nothing from cudaMalloc or cuMemAlloc.
//
//   emu_nccl_rank DIR [--window-start|--window-taken|--vmm-only]  one rank alone
//   emu_nccl_rank DIR --peer                           two ranks: this one starts the other (this program again,
//                                                      under the shim) and they map each other's buffers
//   emu_nccl_rank DIR --restored                       started by `cuda-ckpt restore`: checks its memory
//   emu_nccl_rank DIR --replayed                       started by `restore --replay`: makes it again, writing
//                                                      nothing, and checks addresses and bytes
//
// Rank r keeps its files in DIR/r (DIR/0 for this process). Its memory, as NCCL makes it: first a 2 MiB
// reservation (the driver ignores the hint of one so small), a 2 MiB device buffer of POSIX-FD handles, a
// memory pool of the device (cuMemPoolCreate) with an allocation from it, and 2 MiB of host memory
// (cuMemCreate on HOST_NUMA) that the CPU writes. With --peer the ranks send each other the POSIX FDs of their
// device buffer and host memory over a socket, as NCCL's proxy does, and each maps the other's. The rank
// prints `pid R PID`, writes DIR/R/state and prints `ready R`; then DIR/R/check checks every byte, the peer's
// included ("ok R N" or "bad R ..."), and DIR/R/finish frees it all the way NCCL frees ("done R").
//
// --vmm-only: no memory pool either: every byte is mapped with the VMM API, as a framework's own allocator
// maps it. --window-start: the first VMM call reserves the start of device 0's VMM window by its hint. --window-taken:
// before any CUDA call the program maps that address itself, so the shim cannot have the window; the
// reservation fails ("reserve failed N") and the program exits 3.
#include <cuda.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "vmm_support.hpp"

using namespace vmmckpt::programs;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr unsigned long long window_start = 0x300000000000ULL;  // device 0's VMM window by default

struct state {
  unsigned long long first = 0;                       // the first, small reservation, never mapped
  unsigned long long buffer = 0, buffer_handle = 0;   // device memory, 2 MiB
  unsigned long long pool = 0, pooled = 0;            // the memory pool and one allocation of 1 MiB from it
  unsigned long long host = 0, host_handle = 0;       // host memory, 2 MiB
  unsigned long long peer_buffer = 0, peer_host = 0;  // the peer's memory mapped here; 0 without a peer
  unsigned long long peer_buffer_handle = 0, peer_host_handle = 0;
  int rank = 0, peer = -1;
};

void save(const fs::path& file, const state& s) {
  std::ofstream(file) << s.first << ' ' << s.buffer << ' ' << s.buffer_handle << ' ' << s.pool << ' ' << s.pooled << ' '
                      << s.host << ' ' << s.host_handle << ' ' << s.peer_buffer << ' ' << s.peer_host << ' '
                      << s.peer_buffer_handle << ' ' << s.peer_host_handle << ' ' << s.rank << ' ' << s.peer << '\n';
}

state load(const fs::path& file) {
  std::ifstream in(file);
  state s;
  in >> s.first >> s.buffer >> s.buffer_handle >> s.pool >> s.pooled >> s.host >> s.host_handle >> s.peer_buffer >>
      s.peer_host >> s.peer_buffer_handle >> s.peer_host_handle >> s.rank >> s.peer;
  VMMCKPT_EXPECT(in.good());
  return s;
}

unsigned seed(int rank, int what) { return static_cast<unsigned>(10 * what + rank); }

CUmemAllocationProp host_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Device access, and for host memory the CPU's too (NCCL's host buffers are written by its proxy thread).
void give_access(CUdeviceptr va, std::size_t size, bool host) {
  CUmemAccessDesc desc[2] = {read_write(0), read_write(0)};
  desc[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  desc[1].location.id = 0;
  VMMCKPT_CHECK(cuMemSetAccess(va, size, desc, host ? 2 : 1));
}

// The host memory's pattern, written and read by the CPU.
void write_host(unsigned long long va, unsigned s) {
  auto* p = reinterpret_cast<unsigned*>(va);
  for (std::size_t i = 0; i < 2 * mib / sizeof(unsigned); ++i) p[i] = s * 2654435761u + static_cast<unsigned>(i);
}
bool host_has(unsigned long long va, unsigned s) {
  const auto* p = reinterpret_cast<const unsigned*>(va);
  for (std::size_t i = 0; i < 2 * mib / sizeof(unsigned); ++i)
    if (p[i] != s * 2654435761u + static_cast<unsigned>(i)) return false;
  return true;
}

unsigned long long map_new(CUmemGenericAllocationHandle h, std::size_t size, bool host) {
  CUdeviceptr va = 0;
  VMMCKPT_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
  VMMCKPT_CHECK(cuMemMap(va, size, 0, h, 0));
  give_access(va, size, host);
  return va;
}

void add_pool(state& s, bool write);

state build(int rank, bool first_at_window_start, bool write, bool with_pool = true) {
  state s;
  s.rank = rank;
  CUdeviceptr va = 0;
  const CUresult reserved = cuMemAddressReserve(&va, 2 * mib, 0, first_at_window_start ? window_start : 0, 0);
  if (reserved != CUDA_SUCCESS) {
    std::printf("reserve failed %d\n", static_cast<int>(reserved));
    std::fflush(stdout);
    std::exit(3);
  }
  s.first = va;
  if (first_at_window_start) std::printf("first reservation at 0x%llx\n", s.first);

  const CUmemAllocationProp device = device_prop(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemGenericAllocationHandle h = 0;
  VMMCKPT_CHECK(cuMemCreate(&h, 2 * mib, &device, 0));
  s.buffer_handle = h;
  s.buffer = map_new(h, 2 * mib, false);
  if (write) write_pattern(s.buffer, 2 * mib, seed(rank, 1));

  if (with_pool) add_pool(s, write);

  const CUmemAllocationProp host = host_prop();
  VMMCKPT_CHECK(cuMemCreate(&h, 2 * mib, &host, 0));
  s.host_handle = h;
  s.host = map_new(h, 2 * mib, true);
  if (write) write_host(s.host, seed(rank, 3));
  VMMCKPT_CHECK(cuCtxSynchronize());
  return s;
}

// A memory pool of the device, as NCCL makes one per communicator, and 1 MiB taken from it.
void add_pool(state& s, bool write) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  props.maxSize = 64 * mib;
  CUmemoryPool pool = nullptr;
  VMMCKPT_CHECK(cuMemPoolCreate(&pool, &props));
  s.pool = reinterpret_cast<unsigned long long>(pool);
  CUdeviceptr freed = 0;
  VMMCKPT_CHECK(cuMemAllocFromPoolAsync(&freed, mib, pool, nullptr));  // taken and given back, as NCCL's shadows
  VMMCKPT_CHECK(cuMemFreeAsync(freed, nullptr));
  CUdeviceptr va = 0;
  VMMCKPT_CHECK(cuMemAllocFromPoolAsync(&va, mib, pool, nullptr));
  s.pooled = va;
  // Past its maxSize, a pool answers out of memory.
  CUdeviceptr too_much = 0;
  VMMCKPT_EXPECT(cuMemAllocFromPoolAsync(&too_much, 64 * mib, pool, nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  if (write) write_pattern(s.pooled, mib, seed(s.rank, 2));
}

// NCCL's proxy sends its peer the POSIX FDs of its buffers over a Unix socket.
void send_fds(int sock, int a, int b) {
  char byte = 'f';
  iovec io{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {a, b};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  VMMCKPT_EXPECT(sendmsg(sock, &msg, 0) == 1);
}

void receive_fds(int sock, int& a, int& b) {
  char byte = 0;
  iovec io{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  VMMCKPT_EXPECT(recvmsg(sock, &msg, 0) == 1);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  VMMCKPT_EXPECT(c != nullptr && c->cmsg_type == SCM_RIGHTS);
  int fds[2];
  std::memcpy(fds, CMSG_DATA(c), sizeof fds);
  a = fds[0];
  b = fds[1];
}

int export_fd(unsigned long long handle) {
  int fd = -1;
  VMMCKPT_CHECK(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return fd;
}

// Each rank exports its two buffers to the other and maps the other's: rank 0 sends first.
void exchange(state& s, int sock) {
  const int mine[2] = {export_fd(s.buffer_handle), export_fd(s.host_handle)};
  int theirs[2] = {-1, -1};
  if (s.rank == 0) send_fds(sock, mine[0], mine[1]);
  receive_fds(sock, theirs[0], theirs[1]);
  if (s.rank == 1) send_fds(sock, mine[0], mine[1]);
  for (int fd : mine) close(fd);
  CUmemGenericAllocationHandle h = 0;
  VMMCKPT_CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(theirs[0])),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  s.peer_buffer_handle = h;
  s.peer_buffer = map_new(h, 2 * mib, false);
  VMMCKPT_CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(theirs[1])),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  s.peer_host_handle = h;
  s.peer_host = map_new(h, 2 * mib, true);
  for (int fd : theirs) close(fd);
  s.peer = 1 - s.rank;
}

std::string problem(const state& s) {
  if (!has_pattern(s.buffer, 2 * mib, seed(s.rank, 1))) return "device buffer";
  if (s.pooled != 0 && !has_pattern(s.pooled, mib, seed(s.rank, 2))) return "memory pool allocation";
  if (!host_has(s.host, seed(s.rank, 3))) return "host memory";
  if (s.peer >= 0 && s.peer_buffer != 0 && !has_pattern(s.peer_buffer, 2 * mib, seed(s.peer, 1)))
    return "the peer's device buffer";
  if (s.peer >= 0 && s.peer_host != 0 && !host_has(s.peer_host, seed(s.peer, 3))) return "the peer's host memory";
  return {};
}

// NCCL's free of a buffer: retain on the pointer and release that reference, then unmap, release, free.
// A restored process holds no valid value for an imported handle (docs/vmm.md, known gaps): `handle` 0
// frees with the one the retain gives.
void free_mapping(unsigned long long va, unsigned long long handle) {
  CUmemGenericAllocationHandle retained = 0;
  VMMCKPT_CHECK(cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va)));
  VMMCKPT_CHECK(cuMemRelease(retained));
  if (handle == 0) handle = retained;
  std::size_t size = 0;
  VMMCKPT_CHECK(cuMemGetAddressRange(nullptr, &size, va));
  VMMCKPT_CHECK(cuMemUnmap(va, size));
  VMMCKPT_CHECK(cuMemRelease(handle));
  VMMCKPT_CHECK(cuMemAddressFree(va, size));
}

// `restored`: a new process restored from an image, whose memory came back but whose driver objects (the
// memory pool, the imported handles) did not: those are made again, as a program restored this way must.
void finish(const state& s, bool restored) {
  if (s.peer_buffer != 0) free_mapping(s.peer_buffer, restored ? 0 : s.peer_buffer_handle);
  if (s.peer_host != 0) free_mapping(s.peer_host, restored ? 0 : s.peer_host_handle);
  free_mapping(s.buffer, s.buffer_handle);
  free_mapping(s.host, s.host_handle);
  if (s.pooled != 0) VMMCKPT_CHECK(cuMemFreeAsync(s.pooled, nullptr));
  if (s.pool != 0 && !restored) VMMCKPT_CHECK(cuMemPoolDestroy(reinterpret_cast<CUmemoryPool>(s.pool)));
  VMMCKPT_CHECK(cuMemAddressFree(s.first, 2 * mib));
}

int serve(const fs::path& dir, const state& s, bool restored = false) {
  for (int checks = 0;;) {
    if (fs::remove(dir / "check")) {
      const std::string why = problem(s);
      if (why.empty())
        std::printf("ok %d %d\n", s.rank, ++checks);
      else
        std::printf("bad %d %s\n", s.rank, why.c_str());
    }
    if (fs::remove(dir / "finish")) {
      finish(s, restored);
      std::printf("done %d\n", s.rank);
      return 0;
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int run_rank(const fs::path& top, int rank, int sock, bool window_start, bool with_pool = true) {
  const fs::path dir = top / std::to_string(rank);
  fs::create_directories(dir);
  std::printf("pid %d %d\n", rank, static_cast<int>(getpid()));
  std::fflush(stdout);
  start_cuda();
  state s = build(rank, window_start, true, with_pool);
  if (sock >= 0) exchange(s, sock);
  save(dir / "state", s);
  std::printf("ready %d\n", rank);
  std::fflush(stdout);
  return serve(dir, s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [--peer|--restored|--replayed|--window-start|--window-taken]\n", argv[0]);
    return 2;
  }
  const fs::path top = argv[1];
  const std::string mode = argc > 2 ? argv[2] : "";
  if (mode == "--as-peer") return run_rank(top, 1, std::atoi(argv[3]), false);
  if (mode == "--restored" || mode == "--replayed") {
    const int rank = argc > 3 ? std::atoi(argv[3]) : 0;
    const fs::path dir = top / std::to_string(rank);
    state s = load(dir / "state");
    start_cuda();
    if (mode == "--replayed") {
      // The same calls again: the same addresses, and the image's bytes in place at the end of each. The
      // driver objects are this run's own (its pool).
      const state again = build(rank, false, false);
      if (again.first != s.first || again.buffer != s.buffer || again.pooled != s.pooled || again.host != s.host ||
          again.buffer_handle != s.buffer_handle || again.host_handle != s.host_handle) {
        std::printf("bad %d the replayed run's addresses or tokens differ\n", rank);
        return 1;
      }
      s = again;
    }
    const std::string why = problem(s);
    std::printf("%s %d %s\n", why.empty() ? (mode == "--replayed" ? "replayed" : "restored") : "bad", rank,
                why.c_str());
    std::fflush(stdout);
    return why.empty() ? serve(dir, s, mode == "--restored") : 1;
  }
  if (mode == "--window-taken") {
    // The program's own mapping where the shim would reserve device 0's VMM window.
    void* at = mmap(reinterpret_cast<void*>(window_start), 2 * mib, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    VMMCKPT_EXPECT(at == reinterpret_cast<void*>(window_start));
    return run_rank(top, 0, -1, false);
  }
  if (mode != "--peer") return run_rank(top, 0, -1, mode == "--window-start", mode != "--vmm-only");
  int pair[2];
  VMMCKPT_EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  std::fflush(stdout);
  const pid_t child = fork();
  VMMCKPT_EXPECT(child >= 0);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that kills rank 0 leaves no rank 1 behind
    close(pair[0]);
    const std::string fd = std::to_string(pair[1]);
    execl("/proc/self/exe", argv[0], top.c_str(), "--as-peer", fd.c_str(), static_cast<char*>(nullptr));
    _exit(4);
  }
  close(pair[1]);
  const int code = run_rank(top, 0, pair[0], false);
  int status = 0;
  waitpid(child, &status, 0);
  return code != 0 ? code : (WIFEXITED(status) ? WEXITSTATUS(status) : 5);
}
