// The restore tests' linked list: node layout, sizes, order, the walk that checks it, and the list file, for emu/linked_list.cpp and gpu/linked_list.cu.
//
// A node is a header {next, index, payload length, checksum} followed by a payload that is a function of
// the node's index; the checksum covers everything but itself. Nodes have varied sizes (64 B to 200 KiB)
// and are linked in a shuffled order, so `next` points both backwards and forwards in the pool. Only
// pointers stored in device memory lead from one node to the next: a restore that puts a node elsewhere,
// or garbles a byte, is caught at that node. The builder records every node's address and size and the
// list's checksum in a text file (write_list_file), which walk and replay read after a restore.
//
// The functions marked VMMCKPT_HOST_DEVICE run in the GPU program's kernels too; walk_list() is the one
// walk both programs run, on the device there and through copies to the host on the emulator.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "host_device.hpp"

namespace vmmckpt::contracts::linked_list {

inline constexpr std::uint64_t header_words = 4;  // next, index, payload length, checksum
inline constexpr std::uint64_t header_bytes = header_words * 8;
inline constexpr std::uint64_t no_node = ~0ULL;
inline constexpr std::uint64_t default_nodes = 200;
inline constexpr std::uint64_t max_nodes = 100000;

// splitmix64's finalizer: sizes, order and payload all derive from it, so the same index gives the same
// node in build, walk and replay, on the host and on the device.
VMMCKPT_HOST_DEVICE inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

VMMCKPT_HOST_DEVICE inline std::uint64_t fold(std::uint64_t h, std::uint64_t v) { return mix(h ^ v); }

VMMCKPT_HOST_DEVICE inline std::uint64_t payload_word(std::uint64_t index, std::uint64_t word) {
  return mix((index << 32) ^ word ^ 0x5eedULL);
}

// Three size classes, so that small nodes share pages and large ones do not: 64 B..1 KiB, 1..16 KiB,
// 16..200 KiB, all multiples of 8 (the payload is checked in words).
inline std::uint64_t node_size(std::uint64_t index) {
  const std::uint64_t h = mix(index * 3 + 1);
  const std::uint64_t r = h >> 8;
  std::uint64_t size = 0;
  switch (h % 3) {
    case 0: size = 64 + r % (1024 - 64 + 1); break;
    case 1: size = 1024 + r % (16 * 1024 - 1024 + 1); break;
    default: size = 16 * 1024 + r % (200 * 1024 - 16 * 1024 + 1); break;
  }
  return std::max<std::uint64_t>(64, size & ~std::uint64_t{7});
}

// Every 16th node is followed by a spacer block that build frees once all nodes exist: the image then has
// holes between nodes, which a restored allocator must treat as free (and only those).
inline bool has_spacer(std::uint64_t index) { return index % 16 == 5; }
inline std::uint64_t spacer_size(std::uint64_t index) { return node_size(index + 100000) * 3; }

// Build's allocation sequence, exactly: replay repeats it call for call to get the same addresses.
// alloc(size) returns a device address, release(address) frees it.
template <class Alloc, class Release>
std::vector<std::uint64_t> allocate_nodes(std::uint64_t n, Alloc alloc, Release release) {
  std::vector<std::uint64_t> nodes(n), spacers;
  for (std::uint64_t i = 0; i < n; ++i) {
    nodes[i] = alloc(node_size(i));
    if (has_spacer(i)) spacers.push_back(alloc(spacer_size(i)));
  }
  for (std::uint64_t s : spacers) release(s);
  return nodes;
}

// List order: a fixed shuffle of the indices (Fisher-Yates driven by mix), so neighbours in the list are
// far apart and in both directions in memory.
inline std::vector<std::uint64_t> list_order(std::uint64_t n) {
  std::vector<std::uint64_t> order(n);
  for (std::uint64_t i = 0; i < n; ++i) order[i] = i;
  for (std::uint64_t i = n; i > 1; --i) std::swap(order[i - 1], order[mix(0x0dd5eedULL + i) % i]);
  return order;
}

// next[i]: the address of the node after node i in list order, 0 for the tail.
inline std::vector<std::uint64_t> next_pointers(const std::vector<std::uint64_t>& nodes) {
  const auto order = list_order(nodes.size());
  std::vector<std::uint64_t> next(nodes.size(), 0);
  for (std::size_t k = 0; k + 1 < order.size(); ++k) next[order[k]] = nodes[order[k + 1]];
  return next;
}

// A node's words, built in place: the header, then the payload (on the device, threads share that
// loop), then seal() once the payload is complete.
VMMCKPT_HOST_DEVICE inline void write_header(std::uint64_t* node, std::uint64_t next, std::uint64_t index,
                                             std::uint64_t payload_words) {
  node[0] = next;
  node[1] = index;
  node[2] = payload_words * 8;
  node[3] = 0;
}

VMMCKPT_HOST_DEVICE inline std::uint64_t node_checksum(const std::uint64_t* node) {
  std::uint64_t sum = fold(fold(fold(0x11157ULL, node[0]), node[1]), node[2]);
  for (std::uint64_t w = 0; w < node[2] / 8; ++w) sum = fold(sum, node[header_words + w]);
  return sum;
}

VMMCKPT_HOST_DEVICE inline void seal(std::uint64_t* node) { node[3] = node_checksum(node); }

// ---- the walk ---------------------------------------------------------------------------------------

enum walk_defect : std::uint64_t {
  defect_none = 0,
  defect_stray_pointer,  // `next` is not a node's address
  defect_too_long,       // more nodes than the file has (a cycle)
  defect_order,          // a node other than the one the shuffle puts here; detail: the expected index
  defect_index,          // detail: the index the header holds
  defect_length,         // detail: the payload length the header holds
  defect_payload,        // detail: the first word that differs
  defect_checksum,
  defect_too_short,  // the list ends early
};

struct walk_result {
  std::uint64_t steps;
  std::uint64_t sum;  // fold of every node's checksum in list order
  std::uint64_t defect;
  std::uint64_t bad_step;
  std::uint64_t bad_addr;
  std::uint64_t bad_node;  // its index, or no_node
  std::uint64_t detail;
};

// Reads a node in place: on the device, where the walk runs next to the data.
struct in_place {
  VMMCKPT_HOST_DEVICE const std::uint64_t* operator()(std::uint64_t addr, std::uint64_t /*size*/) const {
    return reinterpret_cast<const std::uint64_t*>(addr);
  }
};

// What the walk looks up, in four arrays of n words (walk_tables below): the node addresses in
// ascending order, their indices, the list order and each index's size.
struct walk_view {
  std::uint64_t n;
  const std::uint64_t* sorted_addrs;
  const std::uint64_t* index_of;
  const std::uint64_t* order;
  const std::uint64_t* sizes;
};

// Follows the list from `head` through the pointers stored in the nodes only, checking every node against
// what its index says it must hold; stops at the first defect. read(addr, size) gives a node's words. A
// stray pointer is refused by looking it up, never followed.
template <class Read>
VMMCKPT_HOST_DEVICE walk_result walk_list(std::uint64_t head, const walk_view& v, Read read) {
  walk_result r{0, 0, defect_none, 0, 0, no_node, 0};
  std::uint64_t cur = head;
  while (cur != 0) {
    std::uint64_t lo = 0, hi = v.n;
    while (lo < hi) {
      const std::uint64_t mid = (lo + hi) / 2;
      if (v.sorted_addrs[mid] < cur)
        lo = mid + 1;
      else
        hi = mid;
    }
    r.bad_step = r.steps;
    r.bad_addr = cur;
    r.bad_node = no_node;
    if (lo == v.n || v.sorted_addrs[lo] != cur) {
      r.defect = defect_stray_pointer;
      return r;
    }
    const std::uint64_t i = v.index_of[lo];
    r.bad_node = i;
    if (r.steps >= v.n) {
      r.defect = defect_too_long;
      return r;
    }
    if (i != v.order[r.steps]) {
      r.defect = defect_order;
      r.detail = v.order[r.steps];
      return r;
    }
    const std::uint64_t* node = read(cur, v.sizes[i]);
    if (node[1] != i) {
      r.defect = defect_index;
      r.detail = node[1];
      return r;
    }
    if (node[2] != v.sizes[i] - header_bytes) {
      r.defect = defect_length;
      r.detail = node[2];
      return r;
    }
    const std::uint64_t words = node[2] / 8;
    std::uint64_t w = 0;
    while (w < words && node[header_words + w] == payload_word(i, w)) ++w;
    if (w != words) {
      r.defect = defect_payload;
      r.detail = w;
      return r;
    }
    if (node_checksum(node) != node[3]) {
      r.defect = defect_checksum;
      return r;
    }
    r.sum = fold(r.sum, node[3]);
    ++r.steps;
    cur = node[0];
  }
  if (r.steps != v.n) {
    r.defect = defect_too_short;
    r.bad_step = r.steps;
    r.bad_addr = 0;
    r.bad_node = no_node;
  }
  return r;
}

// ---- the list file ----------------------------------------------------------------------------------

struct list_file {
  std::uint64_t nodes = 0;
  std::uint64_t head = 0;
  std::uint64_t checksum = 0;        // fold of every node's checksum in list order
  std::vector<std::uint64_t> addrs;  // by index
  std::vector<std::uint64_t> sizes;
};

// The file for a list built at these node addresses, with the checksum its walk computed.
inline list_file describe_list(const std::vector<std::uint64_t>& nodes, std::uint64_t checksum) {
  list_file f;
  f.nodes = nodes.size();
  f.head = nodes.empty() ? 0 : nodes[list_order(nodes.size())[0]];
  f.checksum = checksum;
  f.addrs = nodes;
  for (std::uint64_t i = 0; i < f.nodes; ++i) f.sizes.push_back(node_size(i));
  return f;
}

// The walk's tables for a file's list (walk_view over tables.data()).
struct walk_tables {
  std::vector<std::uint64_t> words;
  explicit walk_tables(const list_file& f) : words(4 * f.nodes) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> by_addr;
    for (std::uint64_t i = 0; i < f.nodes; ++i) by_addr.emplace_back(f.addrs[i], i);
    std::sort(by_addr.begin(), by_addr.end());
    const auto order = list_order(f.nodes);
    for (std::uint64_t k = 0; k < f.nodes; ++k) {
      words[k] = by_addr[k].first;
      words[f.nodes + k] = by_addr[k].second;
      words[2 * f.nodes + k] = order[k];
      words[3 * f.nodes + k] = f.sizes[k];
    }
  }
  // The view over these words where they lie (on the host, or a copy of them on the device).
  static walk_view view(const std::uint64_t* at, std::uint64_t n) { return {n, at, at + n, at + 2 * n, at + 3 * n}; }
};

// What went wrong in a walk, or an empty string; with `check_sum`, also a checksum that is not the file's.
inline std::string walk_problem(const walk_result& r, const list_file& f, bool check_sum = true) {
  if (r.defect == defect_none) {
    if (!check_sum || r.sum == f.checksum) return {};
    char text[128];
    std::snprintf(text, sizeof text, "the list's checksum is 0x%" PRIx64 ", the file says 0x%" PRIx64, r.sum,
                  f.checksum);
    return text;
  }
  std::string what;
  switch (r.defect) {
    case defect_stray_pointer: what = "the pointer leading here is not a node of the file"; break;
    case defect_too_long: what = "the list is longer than the file's count (a cycle?)"; break;
    case defect_order: what = "out of order: expected node " + std::to_string(r.detail); break;
    case defect_index: what = "holds index " + std::to_string(r.detail); break;
    case defect_length: what = "wrong payload length " + std::to_string(r.detail); break;
    case defect_payload: what = "payload differs at byte " + std::to_string(r.detail * 8); break;
    case defect_checksum: what = "checksum mismatch"; break;
    case defect_too_short:
      what = "the list ends after " + std::to_string(r.steps) + " of " + std::to_string(f.nodes) + " nodes";
      break;
    default: what = "defect " + std::to_string(r.defect); break;
  }
  char where[128];
  std::snprintf(where, sizeof where, "bad node: step %" PRIu64 " of the list, node %s at 0x%" PRIx64 ": ", r.bad_step,
                r.bad_node == no_node ? "?" : std::to_string(r.bad_node).c_str(), r.bad_addr);
  return where + what;
}

inline bool write_list_file(const std::string& path, const list_file& f) {
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

// Reads a list file into `f`; on a defect returns false with `error` naming it.
inline bool read_list_file(const std::string& path, list_file& f, std::string& error);

// The list file, or the program ends (exit 1) naming what is wrong with it.
inline list_file read_list_file_or_exit(const std::string& path) {
  list_file f;
  std::string error;
  if (!read_list_file(path, f, error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    std::exit(1);
  }
  return f;
}

inline bool read_list_file(const std::string& path, list_file& f, std::string& error) {
  FILE* in = std::fopen(path.c_str(), "r");
  if (!in) {
    error = "cannot open " + path;
    return false;
  }
  f = {};
  int version = 0;
  if (std::fscanf(in, "vmmckpt-linked-list %d nodes %" SCNu64 " head %" SCNx64 " checksum %" SCNx64, &version, &f.nodes,
                  &f.head, &f.checksum) != 4 ||
      version != 1 || f.nodes == 0 || f.nodes > max_nodes) {
    std::fclose(in);
    error = path + ": not a linked list file";
    return false;
  }
  f.addrs.resize(f.nodes);
  f.sizes.resize(f.nodes);
  for (std::uint64_t i = 0; i < f.nodes; ++i) {
    std::uint64_t index = 0;
    if (std::fscanf(in, " node %" SCNu64 " %" SCNx64 " %" SCNu64, &index, &f.addrs[i], &f.sizes[i]) != 3 ||
        index != i || f.sizes[i] != node_size(i)) {
      std::fclose(in);
      error = path + ": bad line for node " + std::to_string(i);
      return false;
    }
  }
  std::fclose(in);
  return true;
}

// ---- the programs' command line and what happens after a restore ------------------------------------

// The modes both programs have, and the command line that picks one: `PROGRAM MODE FILE`, and for build
// `--nodes N`. `more` handles the modes only one program has (a null function, or -1 from it: none).
struct modes {
  int (*build)(const std::string& path, std::uint64_t nodes);
  int (*walk)(const std::string& path);
  int (*replay)(const std::string& path);
  int (*more)(const std::string& mode, const std::string& path) = nullptr;
};

inline int run_mode(int argc, char** argv, const modes& m, const char* usage) {
  const auto bad_usage = [usage] {
    std::fprintf(stderr, "%s", usage);
    return 2;
  };
  if (argc < 3) return bad_usage();
  const std::string mode = argv[1], path = argv[2];
  std::uint64_t nodes = default_nodes;
  if (argc != 3) {
    if (mode != "build" || argc != 5 || std::string(argv[3]) != "--nodes") return bad_usage();
    nodes = std::strtoull(argv[4], nullptr, 10);
    if (nodes < 1 || nodes > max_nodes) return bad_usage();
  }
  if (mode == "build") return m.build(path, nodes);
  if (mode == "walk") return m.walk(path);
  if (mode == "replay") return m.replay(path);
  const int more = m.more ? m.more(mode, path) : -1;
  return more == -1 ? bad_usage() : more;
}

// Replay repeated build's allocations: each node must be where the file says, or restore broke it.
inline std::string replay_problem(const std::vector<std::uint64_t>& nodes, const list_file& f) {
  for (std::uint64_t i = 0; i < f.nodes; ++i)
    if (nodes[i] != f.addrs[i]) {
      char text[128];
      std::snprintf(text, sizeof text, "node %" PRIu64 ": allocated at 0x%" PRIx64 ", the file says 0x%" PRIx64, i,
                    nodes[i], f.addrs[i]);
      return text;
    }
  return {};
}

// After a restore the nodes are live allocations:

// New blocks a program allocates around restored nodes: small ones that fit the holes between nodes and
// large ones that need new physical memory.
inline constexpr int fresh_blocks = 50;
inline std::uint64_t fresh_block_size(int k) {
  const std::uint64_t h = mix(0xf5e5ULL + static_cast<std::uint64_t>(k));
  return k % 10 == 9 ? (2u << 20) + h % (2u << 20) : 256 + h % (300 * 1024);
}

// The node that [addr, addr + size) overlaps, or no_node.
inline std::uint64_t overlapped_node(const list_file& f, std::uint64_t addr, std::uint64_t size) {
  for (std::uint64_t i = 0; i < f.nodes; ++i)
    if (addr < f.addrs[i] + f.sizes[i] && f.addrs[i] < addr + size) return i;
  return no_node;
}

}  // namespace vmmckpt::contracts::linked_list
