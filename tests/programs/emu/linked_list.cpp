// Emulator test program for cuda-ckpt restore: a linked list whose nodes point at each other in device memory.
//
//   linked_list build FILE [--nodes N]   allocate and link N nodes, record them in FILE, print `ready`, sleep
//   linked_list walk FILE                (restored, default mode) walk and check the list, use and free it
//   linked_list replay FILE              (restored with --replay) repeat build's allocations, then as walk
//   linked_list walk-occupied FILE       the pool base is mmapped first: every memory call must be refused
//   linked_list walk-expect-oom FILE     too little device memory: every memory call must be refused
//
// The list, its walk and its file are contracts/linked_list.hpp, shared with gpu/linked_list.cu; here the
// emulator's host functions stand in for kernels, so the walk reads each node into host memory.
#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "contracts/ptr_line.hpp"
#include "support/cuda_check.hpp"
#include "contracts/linked_list.hpp"

using vmmckpt::contracts::print_ptr;

namespace {

namespace ll = vmmckpt::contracts::linked_list;

CUcontext init_cuda() {
  VMMCKPT_CHECK(cuInit(0));
  CUcontext ctx;
  VMMCKPT_CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  VMMCKPT_CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

std::vector<std::uint64_t> allocate_nodes(std::uint64_t n) {
  return ll::allocate_nodes(
      n,
      [](std::uint64_t size) {
        CUdeviceptr p = 0;
        VMMCKPT_CHECK(cuMemAlloc(&p, size));
        return static_cast<std::uint64_t>(p);
      },
      [](std::uint64_t p) { VMMCKPT_CHECK(cuMemFree(p)); });
}


const char* error_name(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return name ? name : "?";
}

// The shared walk, each node copied to the host as it is reached. Returns the list's checksum; exits
// naming the first bad node, or when `check_sum` and the checksum is not the file's.
std::uint64_t walk_list(const ll::list_file& f, bool check_sum = true) {
  const ll::walk_tables tables(f);
  std::vector<std::uint64_t> node;
  const auto r = ll::walk_list(f.head, ll::walk_tables::view(tables.words.data(), f.nodes),
                               [&node](std::uint64_t addr, std::uint64_t size) {
                                 node.assign(size / 8, 0);
                                 VMMCKPT_CHECK(cuMemcpyDtoH(node.data(), addr, size));
                                 return static_cast<const std::uint64_t*>(node.data());
                               });
  if (const std::string problem = ll::walk_problem(r, f, check_sum); !problem.empty()) {
    std::fprintf(stderr, "%s\n", problem.c_str());
    std::exit(1);
  }
  return r.sum;
}

// The nodes must be real allocations of this process: the shim knows their extent, new blocks avoid them
// (in address and in physical memory), and cuMemFree releases each exactly once.
void use_and_free(const ll::list_file& f) {
  for (std::uint64_t i = 0; i < f.nodes; ++i) {
    CUdeviceptr base = 0;
    size_t size = 0;
    VMMCKPT_CHECK(cuMemGetAddressRange(&base, &size, f.addrs[i] + f.sizes[i] / 2));
    if (base != f.addrs[i] || size != f.sizes[i]) {
      std::fprintf(stderr,
                   "node %" PRIu64 " at 0x%" PRIx64 ": the pool says [0x%llx, +%zu), the file [0x%" PRIx64 ", +%" PRIu64
                   ")\n",
                   i, f.addrs[i], static_cast<unsigned long long>(base), size, f.addrs[i], f.sizes[i]);
      std::exit(1);
    }
  }
  // Each new block filled, so that any aliasing with a node shows up in the second walk.
  std::vector<std::pair<CUdeviceptr, std::size_t>> fresh;
  for (int k = 0; k < ll::fresh_blocks; ++k) {
    const std::size_t size = ll::fresh_block_size(k);
    CUdeviceptr p = 0;
    VMMCKPT_CHECK(cuMemAlloc(&p, size));
    if (const std::uint64_t i = ll::overlapped_node(f, p, size); i != ll::no_node) {
      std::fprintf(stderr, "new block [0x%llx, +%zu) overlaps node %" PRIu64 " at 0x%" PRIx64 "\n",
                   static_cast<unsigned long long>(p), size, i, f.addrs[i]);
      std::exit(1);
    }
    VMMCKPT_CHECK(cuMemsetD8(p, 0xa5, size));
    fresh.emplace_back(p, size);
  }
  VMMCKPT_CHECK(cuCtxSynchronize());
  walk_list(f);
  for (const auto& [p, size] : fresh) VMMCKPT_CHECK(cuMemFree(p));
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
  const auto next = ll::next_pointers(nodes);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::vector<std::uint64_t> words(ll::node_size(i) / 8);
    const std::uint64_t payload_words = words.size() - ll::header_words;
    ll::write_header(words.data(), next[i], i, payload_words);
    for (std::uint64_t w = 0; w < payload_words; ++w) words[ll::header_words + w] = ll::payload_word(i, w);
    ll::seal(words.data());
    VMMCKPT_CHECK(cuMemcpyHtoD(nodes[i], words.data(), ll::node_size(i)));
    print_ptr(nodes[i], ll::node_size(i), "cuMemAlloc");
  }
  VMMCKPT_CHECK(cuCtxSynchronize());
  // The checksum recorded is the walk's over the list as the device holds it (the walk also checks every
  // node against its index, so a bad build is caught here, not blamed on restore).
  ll::list_file f = ll::describe_list(nodes, 0);
  f.checksum = walk_list(f, false);
  if (!ll::write_list_file(path, f)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (int s = 0; s < 300; ++s) sleep(1);  // until the test kills us
  return 0;
}

int walk(const std::string& path) {
  const ll::list_file f = ll::read_list_file_or_exit(path);
  init_cuda();
  walk_list(f);
  use_and_free(f);
  std::printf("walked %" PRIu64 " nodes\n", f.nodes);
  return 0;
}

int replay(const std::string& path) {
  const ll::list_file f = ll::read_list_file_or_exit(path);
  init_cuda();
  const auto nodes = allocate_nodes(f.nodes);
  if (const std::string problem = ll::replay_problem(nodes, f); !problem.empty()) {
    std::fprintf(stderr, "%s\n", problem.c_str());
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
  const ll::list_file f = ll::read_list_file_or_exit(path);
  if (occupy) {
    const char* base_text = std::getenv("VMMCKPT_POOL_BASE");
    const unsigned long long base = base_text ? std::strtoull(base_text, nullptr, 0) : 0x200000000000ULL;
    void* taken = mmap(reinterpret_cast<void*>(base), 2 << 20, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    VMMCKPT_EXPECT(taken == reinterpret_cast<void*>(base));
  }
  init_cuda();
  std::uint64_t header[ll::header_words] = {};
  const CUresult copy = cuMemcpyDtoH(header, f.head, sizeof header);
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

// The modes only the emulator's program has.
int more_modes(const std::string& mode, const std::string& path) {
  if (mode == "walk-occupied") return expect_refused(path, true);
  if (mode == "walk-expect-oom") return expect_refused(path, false);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  return ll::run_mode(argc, argv, {build, walk, replay, more_modes},
                      "usage: linked_list build FILE [--nodes N]\n"
                      "       linked_list walk|replay|walk-occupied|walk-expect-oom FILE\n");
}
