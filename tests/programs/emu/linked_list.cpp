// Emulator test program for cuda-ckpt restore: a linked list whose nodes point at each other in device memory.
//
//   linked_list build FILE [--nodes N]   allocate and link N nodes, record them in FILE, print `ready`, sleep
//   linked_list walk FILE                (restored, default mode) walk and check the list, use and free it
//   linked_list replay FILE              (restored with --replay) repeat build's allocations, then as walk
//   linked_list walk-occupied FILE       the pool base is mmapped first: every memory call must be refused
//   linked_list walk-expect-oom FILE     too little device memory: every memory call must be refused
//
// A node is a header {next, index, payload length, checksum} followed by a payload that is a function of the
// node's index; the checksum covers everything but itself. Nodes have varied sizes (64 B to 200 KiB) and are
// linked in a shuffled order, so `next` points both backwards and forwards in the pool. Only pointers stored
// in device memory lead from one node to the next: a restore that puts a node elsewhere, or garbles a byte,
// is caught at that node.
#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "check.hpp"

namespace {

struct node_header {
  std::uint64_t next;  // device address of the next node in list order, 0 at the tail
  std::uint64_t index;  // allocation order, which fixes size and payload
  std::uint64_t payload_len;
  std::uint64_t checksum;  // over the three fields above and the payload
};
static_assert(sizeof(node_header) == 32);

constexpr std::uint64_t no_node = ~0ULL;

// A strong 64-bit mixer (the splitmix64 finalizer): sizes, order and payload all derive from it, so the
// same index always gives the same node in build, walk and replay.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Three size classes, so that small nodes share pages and large ones do not: 64 B..1 KiB, 1..16 KiB,
// 16..200 KiB, all multiples of 8 (the payload is checked in words).
std::size_t node_size(std::uint64_t index) {
  const std::uint64_t h = mix(index * 3 + 1);
  const std::uint64_t r = h >> 8;
  std::size_t size = 0;
  switch (h % 3) {
    case 0: size = 64 + r % (1024 - 64 + 1); break;
    case 1: size = 1024 + r % (16 * 1024 - 1024 + 1); break;
    default: size = 16 * 1024 + r % (200 * 1024 - 16 * 1024 + 1); break;
  }
  return std::max<std::size_t>(64, size & ~std::size_t{7});
}

// Every 16th node is followed by a spacer block that build frees once all nodes exist: the image then has
// holes between nodes, which a restored allocator must treat as free (and only those).
bool has_spacer(std::uint64_t index) { return index % 16 == 5; }
std::size_t spacer_size(std::uint64_t index) { return node_size(index + 100000) * 3; }

std::uint64_t payload_word(std::uint64_t index, std::uint64_t word) { return mix((index << 32) ^ word ^ 0x5eedULL); }

std::uint64_t fold(std::uint64_t h, std::uint64_t v) { return mix(h ^ v); }

std::uint64_t node_checksum(const node_header& h, const std::uint64_t* payload) {
  std::uint64_t sum = fold(fold(fold(0x11157ULL, h.next), h.index), h.payload_len);
  for (std::uint64_t w = 0; w < h.payload_len / 8; ++w) sum = fold(sum, payload[w]);
  return sum;
}

// List order: a fixed shuffle of the indices (Fisher-Yates driven by mix), so neighbours in the list are
// far apart and in both directions in memory.
std::vector<std::uint64_t> list_order(std::uint64_t n) {
  std::vector<std::uint64_t> order(n);
  for (std::uint64_t i = 0; i < n; ++i) order[i] = i;
  for (std::uint64_t i = n; i > 1; --i) std::swap(order[i - 1], order[mix(0x0dd5eedULL + i) % i]);
  return order;
}

struct list_file {
  std::uint64_t nodes = 0;
  std::uint64_t head = 0;
  std::uint64_t checksum = 0;  // fold of every node's checksum in list order
  std::vector<std::uint64_t> addrs;  // by index
  std::vector<std::uint64_t> sizes;
};

bool write_list_file(const std::string& path, const list_file& f) {
  // Written under a temporary name and renamed: a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  FILE* out = std::fopen(tmp.c_str(), "w");
  if (!out) return false;
  std::fprintf(out, "vmmckpt-linked-list 1\nnodes %" PRIu64 "\nhead 0x%" PRIx64 "\nchecksum 0x%" PRIx64 "\n", f.nodes,
               f.head, f.checksum);
  for (std::uint64_t i = 0; i < f.nodes; ++i)
    std::fprintf(out, "node %" PRIu64 " 0x%" PRIx64 " %" PRIu64 "\n", i, f.addrs[i], f.sizes[i]);
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
  if (std::fscanf(in, "vmmckpt-linked-list %d nodes %" SCNu64 " head %" SCNx64 " checksum %" SCNx64, &version,
                  &f.nodes, &f.head, &f.checksum) != 4 ||
      version != 1 || f.nodes == 0 || f.nodes > 1000000) {
    std::fprintf(stderr, "%s: not a linked list file\n", path.c_str());
    std::exit(1);
  }
  f.addrs.resize(f.nodes);
  f.sizes.resize(f.nodes);
  for (std::uint64_t i = 0; i < f.nodes; ++i) {
    std::uint64_t index = 0;
    if (std::fscanf(in, " node %" SCNu64 " %" SCNx64 " %" SCNu64, &index, &f.addrs[i], &f.sizes[i]) != 3 ||
        index != i || f.sizes[i] != node_size(i)) {
      std::fprintf(stderr, "%s: bad line for node %" PRIu64 "\n", path.c_str(), i);
      std::exit(1);
    }
  }
  std::fclose(in);
  return f;
}

CUcontext init_cuda() {
  CHECK_CU(cuInit(0));
  CUcontext ctx;
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_CU(cuCtxSetCurrent(ctx));
  return ctx;
}

// Build's allocation sequence, exactly: replay must repeat it call for call to get the same addresses.
std::vector<CUdeviceptr> allocate_nodes(std::uint64_t n) {
  std::vector<CUdeviceptr> nodes(n), spacers;
  for (std::uint64_t i = 0; i < n; ++i) {
    CHECK_CU(cuMemAlloc(&nodes[i], node_size(i)));
    if (has_spacer(i)) {
      CUdeviceptr s = 0;
      CHECK_CU(cuMemAlloc(&s, spacer_size(i)));
      spacers.push_back(s);
    }
  }
  for (CUdeviceptr s : spacers) CHECK_CU(cuMemFree(s));
  return nodes;
}

const char* error_name(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return name ? name : "?";
}

[[noreturn]] void bad_node(std::uint64_t step, std::uint64_t index, std::uint64_t addr, const std::string& what) {
  std::fprintf(stderr, "bad node: step %" PRIu64 " of the list, node %s at 0x%" PRIx64 ": %s\n", step,
               index == no_node ? "?" : std::to_string(index).c_str(), addr, what.c_str());
  std::exit(1);
}

// Follows the list from the head through device memory only, checking every node against what its index
// says it must hold. Exits naming the first bad node.
void walk_list(const list_file& f) {
  std::map<std::uint64_t, std::uint64_t> index_at;  // address -> index, to recognise a stray pointer
  for (std::uint64_t i = 0; i < f.nodes; ++i) index_at[f.addrs[i]] = i;
  const auto order = list_order(f.nodes);
  std::vector<std::uint64_t> bytes;
  std::uint64_t cur = f.head, sum = 0, step = 0;
  for (; cur != 0; ++step) {
    const auto it = index_at.find(cur);
    if (it == index_at.end()) bad_node(step, no_node, cur, "the pointer leading here is not a node of the file");
    if (step >= f.nodes) bad_node(step, it->second, cur, "the list is longer than the file's count (a cycle?)");
    const std::uint64_t i = it->second;
    if (i != order[step]) bad_node(step, i, cur, "out of order: expected node " + std::to_string(order[step]));
    bytes.assign(f.sizes[i] / 8, 0);
    CHECK_CU(cuMemcpyDtoH(bytes.data(), cur, f.sizes[i]));
    node_header h;
    std::memcpy(&h, bytes.data(), sizeof h);
    const std::uint64_t* payload = bytes.data() + sizeof h / 8;
    if (h.index != i) bad_node(step, i, cur, "holds index " + std::to_string(h.index));
    if (h.payload_len != f.sizes[i] - sizeof h)
      bad_node(step, i, cur, "wrong payload length " + std::to_string(h.payload_len));
    for (std::uint64_t w = 0; w < h.payload_len / 8; ++w)
      if (payload[w] != payload_word(i, w)) bad_node(step, i, cur, "payload differs at byte " + std::to_string(w * 8));
    if (node_checksum(h, payload) != h.checksum) bad_node(step, i, cur, "checksum mismatch");
    sum = fold(sum, h.checksum);
    cur = h.next;
  }
  if (step != f.nodes)
    bad_node(step, no_node, 0,
             "the list ends after " + std::to_string(step) + " of " + std::to_string(f.nodes) + " nodes");
  if (sum != f.checksum) bad_node(step, no_node, 0, "the list's checksum differs from the file's");
}

bool overlaps(std::uint64_t a, std::uint64_t a_size, std::uint64_t b, std::uint64_t b_size) {
  return a < b + b_size && b < a + a_size;
}

// The nodes must be real allocations of this process: the shim knows their extent, new blocks avoid them
// (in address and in physical memory), and cuMemFree releases each exactly once.
void use_and_free(const list_file& f) {
  for (std::uint64_t i = 0; i < f.nodes; ++i) {
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK_CU(cuMemGetAddressRange(&base, &size, f.addrs[i] + f.sizes[i] / 2));
    if (base != f.addrs[i] || size != f.sizes[i]) {
      std::fprintf(stderr, "node %" PRIu64 " at 0x%" PRIx64 ": the pool says [0x%llx, +%zu), the file [0x%" PRIx64
                   ", +%" PRIu64 ")\n",
                   i, f.addrs[i], static_cast<unsigned long long>(base), size, f.addrs[i], f.sizes[i]);
      std::exit(1);
    }
  }
  // New blocks of all sizes, small ones that fit the holes between nodes and large ones that need new
  // physical memory, each filled so that any aliasing with a node shows up in the second walk.
  std::vector<std::pair<CUdeviceptr, std::size_t>> fresh;
  for (int k = 0; k < 50; ++k) {
    const std::uint64_t h = mix(0xf5e5ULL + k);
    const std::size_t size = k % 10 == 9 ? (2u << 20) + h % (2u << 20) : 256 + h % (300 * 1024);
    CUdeviceptr p = 0;
    CHECK_CU(cuMemAlloc(&p, size));
    for (std::uint64_t i = 0; i < f.nodes; ++i)
      if (overlaps(p, size, f.addrs[i], f.sizes[i])) {
        std::fprintf(stderr, "new block [0x%llx, +%zu) overlaps node %" PRIu64 " at 0x%" PRIx64 "\n",
                     static_cast<unsigned long long>(p), size, i, f.addrs[i]);
        std::exit(1);
      }
    CHECK_CU(cuMemsetD8(p, 0xa5, size));
    fresh.emplace_back(p, size);
  }
  CHECK_CU(cuCtxSynchronize());
  walk_list(f);
  for (const auto& [p, size] : fresh) CHECK_CU(cuMemFree(p));
  for (std::uint64_t i = 0; i < f.nodes; ++i) {
    const CUresult r = cuMemFree(f.addrs[i]);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuMemFree of node %" PRIu64 " at 0x%" PRIx64 " failed: %s\n", i, f.addrs[i], error_name(r));
      std::exit(1);
    }
  }
  // Freed means freed: a second free is the pool's double-free answer, not a success.
  const CUresult again = cuMemFree(f.addrs[0]);
  if (again != CUDA_ERROR_INVALID_VALUE) {
    std::fprintf(stderr, "a second cuMemFree of node 0 answered %s, expected CUDA_ERROR_INVALID_VALUE\n",
                 error_name(again));
    std::exit(1);
  }
}

int build(const std::string& path, std::uint64_t n) {
  init_cuda();
  const auto nodes = allocate_nodes(n);
  const auto order = list_order(n);
  list_file f;
  f.nodes = n;
  f.head = nodes[order[0]];
  for (std::uint64_t i = 0; i < n; ++i) {
    f.addrs.push_back(nodes[i]);
    f.sizes.push_back(node_size(i));
  }
  std::vector<std::uint64_t> next(n, 0);
  for (std::uint64_t k = 0; k + 1 < n; ++k) next[order[k]] = nodes[order[k + 1]];
  std::vector<std::uint64_t> checksums(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::vector<std::uint64_t> bytes(node_size(i) / 8);
    node_header h{next[i], i, node_size(i) - sizeof(node_header), 0};
    std::uint64_t* payload = bytes.data() + sizeof h / 8;
    for (std::uint64_t w = 0; w < h.payload_len / 8; ++w) payload[w] = payload_word(i, w);
    h.checksum = node_checksum(h, payload);
    checksums[i] = h.checksum;
    std::memcpy(bytes.data(), &h, sizeof h);
    CHECK_CU(cuMemcpyHtoD(nodes[i], bytes.data(), node_size(i)));
    print_ptr(nodes[i], node_size(i), "cuMemAlloc");
  }
  for (std::uint64_t k = 0; k < n; ++k) f.checksum = fold(f.checksum, checksums[order[k]]);
  CHECK_CU(cuCtxSynchronize());
  // The list as the GPU holds it, before anyone relies on the file.
  walk_list(f);
  if (!write_list_file(path, f)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (int s = 0; s < 300; ++s) sleep(1);  // until the test kills us
  return 0;
}

int walk(const std::string& path) {
  const list_file f = read_list_file(path);
  init_cuda();
  walk_list(f);
  use_and_free(f);
  std::printf("walked %" PRIu64 " nodes\n", f.nodes);
  return 0;
}

int replay(const std::string& path) {
  const list_file f = read_list_file(path);
  init_cuda();
  const auto nodes = allocate_nodes(f.nodes);
  for (std::uint64_t i = 0; i < f.nodes; ++i)
    if (nodes[i] != f.addrs[i]) {
      std::fprintf(stderr, "node %" PRIu64 ": allocated at 0x%llx, the file says 0x%" PRIx64 "\n", i,
                   static_cast<unsigned long long>(nodes[i]), f.addrs[i]);
      return 1;
    }
  walk_list(f);
  use_and_free(f);
  std::printf("replayed %" PRIu64 " nodes\n", f.nodes);
  return 0;
}

// A restore that cannot happen: the first memory call and an allocation are refused with out-of-memory,
// and the program lives on to say so.
int expect_refused(const std::string& path, bool occupy) {
  const list_file f = read_list_file(path);
  if (occupy) {
    const char* base_text = std::getenv("VMMCKPT_POOL_BASE");
    const unsigned long long base = base_text ? std::strtoull(base_text, nullptr, 0) : 0x200000000000ULL;
    void* taken = mmap(reinterpret_cast<void*>(base), 2 << 20, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    EXPECT(taken == reinterpret_cast<void*>(base));
  }
  init_cuda();
  node_header h{};
  const CUresult copy = cuMemcpyDtoH(&h, f.head, sizeof h);
  CUdeviceptr p = 0;
  const CUresult alloc = cuMemAlloc(&p, 4096);
  std::printf("copy %s\nalloc %s\n", error_name(copy), error_name(alloc));
  if (copy != CUDA_ERROR_OUT_OF_MEMORY || alloc != CUDA_ERROR_OUT_OF_MEMORY) {
    std::fprintf(stderr, "expected CUDA_ERROR_OUT_OF_MEMORY from both the copy and the allocation\n");
    return 1;
  }
  std::printf("refused\n");
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: linked_list build FILE [--nodes N]\n"
               "       linked_list walk|replay|walk-occupied|walk-expect-oom FILE\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string mode = argv[1], path = argv[2];
  if (mode == "build") {
    std::uint64_t n = 200;
    if (argc == 5 && std::strcmp(argv[3], "--nodes") == 0) n = std::strtoull(argv[4], nullptr, 10);
    else if (argc != 3) return usage();
    if (n < 1 || n > 100000) return usage();
    return build(path, n);
  }
  if (argc != 3) return usage();
  if (mode == "walk") return walk(path);
  if (mode == "replay") return replay(path);
  if (mode == "walk-occupied") return expect_refused(path, true);
  if (mode == "walk-expect-oom") return expect_refused(path, false);
  return usage();
}
