// GPU test program for cuda-ckpt restore: a linked list in device memory that kernels build and walk.
//
//   gpu_linked_list build FILE [--nodes N]   allocate, fill (kernels) and link N nodes, record them and the
//                                            list's checksum in FILE, print `ready`, sleep until killed
//   gpu_linked_list walk FILE                (restored, default mode) a one-thread kernel follows `next`
//                                            through device memory; its checksum must equal FILE's; then the
//                                            nodes are used and freed as live allocations
//   gpu_linked_list serve FILE               build, then walk it every tick and log "tick T" to FILE.log until
//                                            FILE.stop appears (whole-process checkpoints: tests/gpu/process_check.py)
//   gpu_linked_list replay FILE              (restored with --replay) repeat build's allocations, compare the
//                                            addresses with FILE, then as walk
//
// The list, its walk and its file are contracts/linked_list.hpp, shared with the emulator's
// tests/programs/emu/linked_list.cpp; here kernels fill the nodes and run the walk on the device.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "contracts/linked_list.hpp"
#include "gpu_check.cuh"

namespace {

namespace ll = vmmckpt::contracts::linked_list;
using u64 = std::uint64_t;

// ---- kernels --------------------------------------------------------------------------------------

__global__ void fill_node(u64* node, u64 index, u64 next, u64 payload_words) {
  const u64 stride = u64{gridDim.x} * blockDim.x;
  for (u64 w = blockIdx.x * u64{blockDim.x} + threadIdx.x; w < payload_words; w += stride)
    node[ll::header_words + w] = ll::payload_word(index, w);
  if (blockIdx.x == 0 && threadIdx.x == 0) ll::write_header(node, next, index, payload_words);  // sealed below
}

// One thread per node: the checksum is a sequential fold.
__global__ void seal_nodes(u64* const* nodes, u64 n) {
  const u64 i = blockIdx.x * u64{blockDim.x} + threadIdx.x;
  if (i < n) ll::seal(nodes[i]);
}

// The walk: one thread, following only the pointers stored in the nodes, next to the data.
__global__ void walk_kernel(u64 head, ll::walk_view view, ll::walk_result* out) {
  *out = ll::walk_list(head, view, ll::in_place{});
}

// ---- host -----------------------------------------------------------------------------------------

std::vector<u64> allocate_nodes(u64 n) {
  return ll::allocate_nodes(
      n,
      [](u64 size) {
        void* p = nullptr;
        VMMCKPT_CHECK(cudaMalloc(&p, size));
        return reinterpret_cast<u64>(p);
      },
      [](u64 p) { VMMCKPT_CHECK(cudaFree(reinterpret_cast<void*>(p))); });
}


struct walk_figures {
  double ms;
  u64 sum;
};

// Runs the walk kernel; exits naming the first bad node, or when `check_sum` and the list's checksum is not
// the file's.
walk_figures walk_on_device(const ll::list_file& f, bool check_sum = true) {
  const ll::walk_tables tables(f);
  u64* d_tables = nullptr;
  ll::walk_result* d_result = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&d_tables, tables.words.size() * 8));
  VMMCKPT_CHECK(cudaMalloc(&d_result, sizeof(ll::walk_result)));
  VMMCKPT_CHECK(cudaMemcpy(d_tables, tables.words.data(), tables.words.size() * 8, cudaMemcpyHostToDevice));
  const auto start = std::chrono::steady_clock::now();
  walk_kernel<<<1, 1>>>(f.head, ll::walk_tables::view(d_tables, f.nodes), d_result);
  GPU_CHECK_LAUNCH();
  VMMCKPT_CHECK(cudaDeviceSynchronize());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ll::walk_result r{};
  VMMCKPT_CHECK(cudaMemcpy(&r, d_result, sizeof r, cudaMemcpyDeviceToHost));
  VMMCKPT_CHECK(cudaFree(d_tables));
  VMMCKPT_CHECK(cudaFree(d_result));
  if (const std::string problem = ll::walk_problem(r, f, check_sum); !problem.empty()) {
    std::fprintf(stderr, "%s\n", problem.c_str());
    std::exit(1);
  }
  return {ms, r.sum};
}

// The nodes must be live allocations of this process: new blocks avoid them (in address and physical
// memory), and cudaFree releases each exactly once.
void use_and_free(const ll::list_file& f) {
  std::vector<std::pair<void*, size_t>> fresh;
  for (int k = 0; k < ll::fresh_blocks; ++k) {
    const size_t size = ll::fresh_block_size(k);
    void* p = nullptr;
    VMMCKPT_CHECK(cudaMalloc(&p, size));
    if (const u64 i = ll::overlapped_node(f, reinterpret_cast<u64>(p), size); i != ll::no_node) {
      std::fprintf(stderr, "new block [%p, +%zu) overlaps node %" PRIu64 " at 0x%" PRIx64 "\n", p, size, i, f.addrs[i]);
      std::exit(1);
    }
    VMMCKPT_CHECK(cudaMemset(p, 0xa5, size));
    fresh.emplace_back(p, size);
  }
  VMMCKPT_CHECK(cudaDeviceSynchronize());
  walk_on_device(f);  // writing the new blocks must not have touched a node
  for (const auto& [p, size] : fresh) VMMCKPT_CHECK(cudaFree(p));
  for (u64 i = 0; i < f.nodes; ++i) {
    const cudaError_t e = cudaFree(reinterpret_cast<void*>(f.addrs[i]));
    if (e != cudaSuccess) {
      std::fprintf(stderr, "cudaFree of node %" PRIu64 " at 0x%" PRIx64 " failed: %s\n", i, f.addrs[i],
                   cudaGetErrorName(e));
      std::exit(1);
    }
  }
  // Freed means freed: a second free is the pool's double-free answer.
  const cudaError_t again = cudaFree(reinterpret_cast<void*>(f.addrs[0]));
  (void)cudaGetLastError();  // not sticky, but leave no error behind for later calls
  if (again != cudaErrorInvalidValue) {
    std::fprintf(stderr, "a second cudaFree of node 0 answered %s, expected cudaErrorInvalidValue\n",
                 cudaGetErrorName(again));
    std::exit(1);
  }
}

// Builds the list and writes FILE; the list's description (checksum included).
ll::list_file build_list(const std::string& path, u64 n) {
  const auto nodes = allocate_nodes(n);
  const auto next = ll::next_pointers(nodes);
  for (u64 i = 0; i < n; ++i) {
    const u64 words = (ll::node_size(i) - ll::header_bytes) / 8;
    const unsigned blocks = static_cast<unsigned>(std::min<u64>(64, (words + 255) / 256));
    fill_node<<<blocks, 256>>>(reinterpret_cast<u64*>(nodes[i]), i, next[i], words);
    GPU_CHECK_LAUNCH();
    gpu_check::print_ptr(static_cast<CUdeviceptr>(nodes[i]), ll::node_size(i), "cudaMalloc");
  }
  u64** d_nodes = nullptr;
  VMMCKPT_CHECK(cudaMalloc(&d_nodes, n * sizeof(u64*)));
  VMMCKPT_CHECK(cudaMemcpy(d_nodes, nodes.data(), n * sizeof(u64*), cudaMemcpyHostToDevice));
  seal_nodes<<<static_cast<unsigned>((n + 127) / 128), 128>>>(d_nodes, n);
  GPU_CHECK_LAUNCH();
  VMMCKPT_CHECK(cudaDeviceSynchronize());
  VMMCKPT_CHECK(cudaFree(d_nodes));

  // The checksum recorded is what the walk kernel computes on the list as built (the walk also checks
  // every node against its index, so a bad build is caught here, not blamed on restore).
  ll::list_file f = ll::describe_list(nodes, 0);
  f.checksum = walk_on_device(f, false).sum;
  if (!ll::write_list_file(path, f)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  return f;
}

int build(const std::string& path, u64 n) {
  const ll::list_file f = build_list(path, n);
  std::printf("checksum 0x%" PRIx64 "\nready\n", f.checksum);
  std::fflush(stdout);
  for (int s = 0; s < 300; ++s) sleep(1);  // until the test kills us
  return 0;
}

// For whole-process checkpoints: the list, walked by the kernel every tick, and a CPU tick counter that
// must go on with it. Appends "tick T" to FILE.log; ends at FILE.stop ("stopped at T"); a bad walk exits 1.
int serve(const std::string& path) {
  const ll::list_file f = build_list(path, ll::default_nodes);
  FILE* log = std::fopen((path + ".log").c_str(), "a");
  if (log == nullptr) return 1;
  for (u64 tick = 1;; ++tick) {
    walk_on_device(f);  // exits naming the first bad node
    std::fprintf(log, "tick %" PRIu64 "\n", tick);
    std::fflush(log);
    if (::access((path + ".stop").c_str(), F_OK) == 0) {
      std::fprintf(log, "stopped at %" PRIu64 "\n", tick);
      std::fclose(log);
      return 0;
    }
    usleep(50'000);
  }
}

int walk(const std::string& path) {
  const ll::list_file f = ll::read_list_file_or_exit(path);
  std::printf("walk kernel %.2f ms\n", walk_on_device(f).ms);
  use_and_free(f);
  std::printf("walked %" PRIu64 " nodes\n", f.nodes);
  return 0;
}

int replay(const std::string& path) {
  const ll::list_file f = ll::read_list_file_or_exit(path);
  const auto nodes = allocate_nodes(f.nodes);
  if (const std::string problem = ll::replay_problem(nodes, f); !problem.empty()) {
    std::fprintf(stderr, "%s\n", problem.c_str());
    return 1;
  }
  std::printf("walk kernel %.2f ms\n", walk_on_device(f).ms);
  use_and_free(f);
  std::printf("replayed %" PRIu64 " nodes\n", f.nodes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ll::run_mode(
      argc, argv,
      {build, walk, replay,
       [](const std::string& mode, const std::string& path) { return mode == "serve" ? serve(path) : -1; }},
      "usage: gpu_linked_list build FILE [--nodes N]\n       gpu_linked_list walk|replay|serve FILE\n");
}
