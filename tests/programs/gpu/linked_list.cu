// GPU test program for cuda-ckpt restore: a linked list in device memory that kernels build and walk.
//
//   gpu_linked_list build FILE [--nodes N]   allocate, fill (kernels) and link N nodes, record them and the
//                                            list's checksum in FILE, print `ready`, sleep until killed
//   gpu_linked_list walk FILE                (restored, default mode) a one-thread kernel follows `next`
//                                            through device memory; its checksum must equal FILE's; then the
//                                            nodes are used and freed as live allocations
//   gpu_linked_list replay FILE              (restored with --replay) repeat build's allocations, compare the
//                                            addresses with FILE, then as walk
//
// Node layout as in the emulator's tests/programs/emu/linked_list.cpp: a header {next, index, payload
// length, checksum} and a payload that is a function of the index; sizes 64 B..200 KiB; linked in a
// shuffled order so that `next` points backwards and forwards.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpu_check.cuh"

namespace {

using u64 = unsigned long long;

constexpr u64 header_words = 4;  // next, index, payload length, checksum
constexpr u64 header_bytes = header_words * 8;

// splitmix64's finalizer: sizes, order and payload derive from it, identically on host and device.
__host__ __device__ inline u64 mix(u64 x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

__host__ __device__ inline u64 fold(u64 h, u64 v) { return mix(h ^ v); }

__host__ __device__ inline u64 payload_word(u64 index, u64 word) { return mix((index << 32) ^ word ^ 0x5eedULL); }

// Three size classes (64 B..1 KiB, 1..16 KiB, 16..200 KiB), multiples of 8: payloads are read in words.
size_t node_size(u64 index) {
  const u64 h = mix(index * 3 + 1);
  const u64 r = h >> 8;
  size_t size = 0;
  switch (h % 3) {
    case 0: size = 64 + r % (1024 - 64 + 1); break;
    case 1: size = 1024 + r % (16 * 1024 - 1024 + 1); break;
    default: size = 16 * 1024 + r % (200 * 1024 - 16 * 1024 + 1); break;
  }
  return std::max<size_t>(64, size & ~size_t{7});
}

// Spacers freed at the end of build leave holes between nodes that a restored allocator must see as free.
bool has_spacer(u64 index) { return index % 16 == 5; }
size_t spacer_size(u64 index) { return node_size(index + 100000) * 3; }

std::vector<u64> list_order(u64 n) {
  std::vector<u64> order(n);
  for (u64 i = 0; i < n; ++i) order[i] = i;
  for (u64 i = n; i > 1; --i) std::swap(order[i - 1], order[mix(0x0dd5eedULL + i) % i]);
  return order;
}

// ---- kernels --------------------------------------------------------------------------------------

__global__ void fill_node(u64* node, u64 index, u64 next, u64 payload_words) {
  const u64 stride = u64{gridDim.x} * blockDim.x;
  for (u64 w = blockIdx.x * u64{blockDim.x} + threadIdx.x; w < payload_words; w += stride)
    node[header_words + w] = payload_word(index, w);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    node[0] = next;
    node[1] = index;
    node[2] = payload_words * 8;
    node[3] = 0;  // sealed below, once the payload is complete
  }
}

__device__ u64 node_checksum(const u64* node) {
  u64 sum = fold(fold(fold(0x11157ULL, node[0]), node[1]), node[2]);
  const u64 words = node[2] / 8;
  for (u64 w = 0; w < words; ++w) sum = fold(sum, node[header_words + w]);
  return sum;
}

// One thread per node: the checksum is a sequential fold.
__global__ void seal_nodes(u64* const* nodes, u64 n) {
  const u64 i = blockIdx.x * u64{blockDim.x} + threadIdx.x;
  if (i < n) nodes[i][3] = node_checksum(nodes[i]);
}

enum walk_defect : u64 {
  defect_none = 0,
  defect_stray_pointer,  // `next` is not a node's address
  defect_too_long,       // more nodes than the file has (a cycle)
  defect_order,          // a node other than the one the shuffle puts here
  defect_index,
  defect_length,
  defect_payload,
  defect_checksum,
  defect_too_short,
};

struct walk_result {
  u64 steps;
  u64 sum;  // fold of every node's checksum in list order
  u64 defect;
  u64 bad_step;
  u64 bad_addr;
  u64 detail;
};

// The walk: one thread, from the head, following only the pointers stored in the nodes. `sorted_addrs`
// (node addresses, ascending, with their indices in `index_of`) lets it refuse a stray pointer instead of
// faulting on it; `order` is the shuffle, to check that each step reaches the right node.
__global__ void walk_list(u64 head, u64 n, const u64* sorted_addrs, const u64* index_of, const u64* order,
                          const u64* sizes, walk_result* out) {
  walk_result r{0, 0, defect_none, 0, 0, 0};
  u64 cur = head;
  while (cur != 0) {
    u64 lo = 0, hi = n;
    while (lo < hi) {
      const u64 mid = (lo + hi) / 2;
      if (sorted_addrs[mid] < cur) lo = mid + 1;
      else hi = mid;
    }
    r.bad_step = r.steps;
    r.bad_addr = cur;
    if (lo == n || sorted_addrs[lo] != cur) { r.defect = defect_stray_pointer; break; }
    if (r.steps >= n) { r.defect = defect_too_long; break; }
    const u64 i = index_of[lo];
    r.detail = i;
    if (i != order[r.steps]) { r.defect = defect_order; break; }
    const u64* node = reinterpret_cast<const u64*>(cur);
    if (node[1] != i) { r.defect = defect_index; break; }
    if (node[2] != sizes[i] - header_bytes) { r.defect = defect_length; break; }
    const u64 words = node[2] / 8;
    u64 w = 0;
    while (w < words && node[header_words + w] == payload_word(i, w)) ++w;
    if (w != words) { r.defect = defect_payload; r.detail = (i << 32) | w; break; }
    if (node_checksum(node) != node[3]) { r.defect = defect_checksum; break; }
    r.sum = fold(r.sum, node[3]);
    ++r.steps;
    cur = node[0];
  }
  if (r.defect == defect_none && r.steps != n) r.defect = defect_too_short;
  *out = r;
}

// ---- host -----------------------------------------------------------------------------------------

struct list_file {
  u64 nodes = 0;
  u64 head = 0;
  u64 checksum = 0;
  std::vector<u64> addrs;  // by index
  std::vector<u64> sizes;
};

bool write_list_file(const std::string& path, const list_file& f) {
  // Temporary name and rename: the test never reads half a file.
  const std::string tmp = path + ".tmp";
  FILE* out = std::fopen(tmp.c_str(), "w");
  if (!out) return false;
  std::fprintf(out, "vmmckpt-linked-list 1\nnodes %llu\nhead 0x%llx\nchecksum 0x%llx\n", f.nodes, f.head, f.checksum);
  for (u64 i = 0; i < f.nodes; ++i) std::fprintf(out, "node %llu 0x%llx %llu\n", i, f.addrs[i], f.sizes[i]);
  const bool ok = std::fflush(out) == 0 && fsync(fileno(out)) == 0;
  return std::fclose(out) == 0 && ok && std::rename(tmp.c_str(), path.c_str()) == 0;
}

list_file read_list_file(const std::string& path) {
  FILE* in = std::fopen(path.c_str(), "r");
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", path.c_str());
    std::exit(1);
  }
  list_file f;
  int version = 0;
  if (std::fscanf(in, "vmmckpt-linked-list %d nodes %llu head %llx checksum %llx", &version, &f.nodes, &f.head,
                  &f.checksum) != 4 ||
      version != 1 || f.nodes == 0 || f.nodes > 1000000) {
    std::fprintf(stderr, "%s: not a linked list file\n", path.c_str());
    std::exit(1);
  }
  f.addrs.resize(f.nodes);
  f.sizes.resize(f.nodes);
  for (u64 i = 0; i < f.nodes; ++i) {
    u64 index = 0;
    if (std::fscanf(in, " node %llu %llx %llu", &index, &f.addrs[i], &f.sizes[i]) != 3 || index != i ||
        f.sizes[i] != node_size(i)) {
      std::fprintf(stderr, "%s: bad line for node %llu\n", path.c_str(), i);
      std::exit(1);
    }
  }
  std::fclose(in);
  return f;
}

// Build's allocation sequence, exactly: replay repeats it call for call.
std::vector<u64> allocate_nodes(u64 n) {
  std::vector<u64> nodes(n);
  std::vector<void*> spacers;
  for (u64 i = 0; i < n; ++i) {
    void* p = nullptr;
    GPU_CHECK(cudaMalloc(&p, node_size(i)));
    nodes[i] = reinterpret_cast<u64>(p);
    if (has_spacer(i)) {
      void* s = nullptr;
      GPU_CHECK(cudaMalloc(&s, spacer_size(i)));
      spacers.push_back(s);
    }
  }
  for (void* s : spacers) GPU_CHECK(cudaFree(s));
  return nodes;
}

const char* defect_text(u64 d) {
  switch (d) {
    case defect_stray_pointer: return "the pointer leading here is not a node of the file";
    case defect_too_long: return "the list is longer than the file's count (a cycle?)";
    case defect_order: return "out of order (not the node the shuffle puts here)";
    case defect_index: return "wrong index in the header";
    case defect_length: return "wrong payload length in the header";
    case defect_payload: return "payload differs";
    case defect_checksum: return "checksum mismatch";
    case defect_too_short: return "the list ends early";
    default: return "?";
  }
}

struct walk_figures {
  double ms;
  u64 sum;
};

// Runs the walk kernel; exits naming the first bad node, or when `check_sum` and the list's checksum is not
// the file's.
walk_figures walk_on_device(const list_file& f, bool check_sum = true) {
  std::vector<std::pair<u64, u64>> by_addr;
  for (u64 i = 0; i < f.nodes; ++i) by_addr.emplace_back(f.addrs[i], i);
  std::sort(by_addr.begin(), by_addr.end());
  std::vector<u64> tables(4 * f.nodes);  // sorted addresses, their indices, the order, the sizes
  const auto order = list_order(f.nodes);
  for (u64 k = 0; k < f.nodes; ++k) {
    tables[k] = by_addr[k].first;
    tables[f.nodes + k] = by_addr[k].second;
    tables[2 * f.nodes + k] = order[k];
    tables[3 * f.nodes + k] = f.sizes[k];
  }
  u64* d_tables = nullptr;
  walk_result* d_result = nullptr;
  GPU_CHECK(cudaMalloc(&d_tables, tables.size() * 8));
  GPU_CHECK(cudaMalloc(&d_result, sizeof(walk_result)));
  GPU_CHECK(cudaMemcpy(d_tables, tables.data(), tables.size() * 8, cudaMemcpyHostToDevice));
  const auto start = std::chrono::steady_clock::now();
  walk_list<<<1, 1>>>(f.head, f.nodes, d_tables, d_tables + f.nodes, d_tables + 2 * f.nodes, d_tables + 3 * f.nodes,
                      d_result);
  GPU_CHECK_LAUNCH();
  GPU_CHECK(cudaDeviceSynchronize());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  walk_result r{};
  GPU_CHECK(cudaMemcpy(&r, d_result, sizeof r, cudaMemcpyDeviceToHost));
  GPU_CHECK(cudaFree(d_tables));
  GPU_CHECK(cudaFree(d_result));
  if (r.defect != defect_none) {
    std::fprintf(stderr, "bad node: step %llu of the list, at 0x%llx (detail 0x%llx): %s\n", r.bad_step, r.bad_addr,
                 r.detail, defect_text(r.defect));
    std::exit(1);
  }
  if (check_sum && r.sum != f.checksum) {
    std::fprintf(stderr, "the list's checksum is 0x%llx, the file says 0x%llx\n", r.sum, f.checksum);
    std::exit(1);
  }
  return {ms, r.sum};
}

bool overlaps(u64 a, u64 a_size, u64 b, u64 b_size) { return a < b + b_size && b < a + a_size; }

// The nodes must be live allocations of this process: new blocks avoid them (in address and physical
// memory), and cudaFree releases each exactly once.
void use_and_free(const list_file& f) {
  std::vector<std::pair<void*, size_t>> fresh;
  for (int k = 0; k < 50; ++k) {
    const u64 h = mix(0xf5e5ULL + k);
    const size_t size = k % 10 == 9 ? (2u << 20) + h % (2u << 20) : 256 + h % (300 * 1024);
    void* p = nullptr;
    GPU_CHECK(cudaMalloc(&p, size));
    for (u64 i = 0; i < f.nodes; ++i)
      if (overlaps(reinterpret_cast<u64>(p), size, f.addrs[i], f.sizes[i])) {
        std::fprintf(stderr, "new block [%p, +%zu) overlaps node %llu at 0x%llx\n", p, size, i, f.addrs[i]);
        std::exit(1);
      }
    GPU_CHECK(cudaMemset(p, 0xa5, size));
    fresh.emplace_back(p, size);
  }
  GPU_CHECK(cudaDeviceSynchronize());
  walk_on_device(f);  // writing the new blocks must not have touched a node
  for (const auto& [p, size] : fresh) GPU_CHECK(cudaFree(p));
  for (u64 i = 0; i < f.nodes; ++i) {
    const cudaError_t e = cudaFree(reinterpret_cast<void*>(f.addrs[i]));
    if (e != cudaSuccess) {
      std::fprintf(stderr, "cudaFree of node %llu at 0x%llx failed: %s\n", i, f.addrs[i], cudaGetErrorName(e));
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

int build(const std::string& path, u64 n) {
  const auto nodes = allocate_nodes(n);
  const auto order = list_order(n);
  std::vector<u64> next(n, 0);
  for (u64 k = 0; k + 1 < n; ++k) next[order[k]] = nodes[order[k + 1]];
  for (u64 i = 0; i < n; ++i) {
    const u64 words = (node_size(i) - header_bytes) / 8;
    const unsigned blocks = static_cast<unsigned>(std::min<u64>(64, (words + 255) / 256));
    fill_node<<<blocks, 256>>>(reinterpret_cast<u64*>(nodes[i]), i, next[i], words);
    GPU_CHECK_LAUNCH();
    gpu_check::print_ptr(static_cast<CUdeviceptr>(nodes[i]), node_size(i), "cudaMalloc");
  }
  u64** d_nodes = nullptr;
  GPU_CHECK(cudaMalloc(&d_nodes, n * sizeof(u64*)));
  GPU_CHECK(cudaMemcpy(d_nodes, nodes.data(), n * sizeof(u64*), cudaMemcpyHostToDevice));
  seal_nodes<<<static_cast<unsigned>((n + 127) / 128), 128>>>(d_nodes, n);
  GPU_CHECK_LAUNCH();
  GPU_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(cudaFree(d_nodes));

  list_file f;
  f.nodes = n;
  f.head = nodes[order[0]];
  f.addrs = nodes;
  for (u64 i = 0; i < n; ++i) f.sizes.push_back(node_size(i));
  // The checksum recorded is what the walk kernel computes on the list as built (the walk also checks
  // every node against its index, so a bad build is caught here, not blamed on restore).
  f.checksum = walk_on_device(f, false).sum;
  if (!write_list_file(path, f)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("checksum 0x%llx\nready\n", f.checksum);
  std::fflush(stdout);
  for (int s = 0; s < 300; ++s) sleep(1);  // until the test kills us
  return 0;
}

int walk(const std::string& path) {
  const list_file f = read_list_file(path);
  std::printf("walk kernel %.2f ms\n", walk_on_device(f).ms);
  use_and_free(f);
  std::printf("walked %llu nodes\n", f.nodes);
  return 0;
}

int replay(const std::string& path) {
  const list_file f = read_list_file(path);
  const auto nodes = allocate_nodes(f.nodes);
  for (u64 i = 0; i < f.nodes; ++i)
    if (nodes[i] != f.addrs[i]) {
      std::fprintf(stderr, "node %llu: allocated at 0x%llx, the file says 0x%llx\n", i, nodes[i], f.addrs[i]);
      return 1;
    }
  std::printf("walk kernel %.2f ms\n", walk_on_device(f).ms);
  use_and_free(f);
  std::printf("replayed %llu nodes\n", f.nodes);
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: gpu_linked_list build FILE [--nodes N]\n       gpu_linked_list walk|replay FILE\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string mode = argv[1], path = argv[2];
  if (mode == "build") {
    u64 n = 200;
    if (argc == 5 && std::strcmp(argv[3], "--nodes") == 0) n = std::strtoull(argv[4], nullptr, 10);
    else if (argc != 3) return usage();
    if (n < 1 || n > 100000) return usage();
    return build(path, n);
  }
  if (argc != 3) return usage();
  if (mode == "walk") return walk(path);
  if (mode == "replay") return replay(path);
  return usage();
}
