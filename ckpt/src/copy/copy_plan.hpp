// The copy's plan: what to copy, in which order, where it lies in a staging buffer and in the GPU snapshot,
// and which runs of bytes leave the program's memory. Pure: worked out from the manifest, the layout and the
// block checksums, with no GPU, file or thread (tests/unit/copy_plan_test.cpp).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "vmmckpt/image/image.hpp"

namespace vmmckpt::ckpt {

// A piece of an allocation: where its bytes are in the chunk's buffer after the copy.
struct piece {
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t offset;  // in the chunk's buffer
};
// One copy and one extent: a run of a pool's memory holding pieces of one or more allocations and
// the gaps between them. Copying small allocations one by one costs a driver call each (200 000
// of them take most of a second), and writing each as an extent of its own costs as much again; a
// span costs one of each. Its pieces' bytes, packed, are the extent's stored bytes: the gaps are
// copied along but never written to the image. Only small allocations are joined: a span of several
// pieces is not contiguous on the GPU, so its blocks are hashed by the CPU after a copy, even when
// nothing in it changed since the parent.
struct span {
  std::size_t pool;    // index into the manifest's pools
  std::size_t extent;  // index into that pool's extents
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t offset;  // in the chunk's buffer
  std::uint64_t stored;  // its pieces' bytes
  std::size_t first_piece, piece_count;
  bool joinable;  // it holds small allocations only: more may join it
};
// One staging buffer's worth of spans, copied back to back; its extents go to one data file.
struct chunk {
  std::vector<piece> pieces;
  std::vector<span> spans;
  std::uint64_t bytes = 0;  // of the buffer, gaps included
};

// The staging buffer of a chunk that is not copied (every block zero or unchanged since the parent).
constexpr std::size_t no_buffer = ~std::size_t{0};

// A gap up to this size between two pieces is copied with them rather than split into two copies.
constexpr std::uint64_t max_gap = 64 << 10;
// Allocations smaller than this are joined into spans; one this size or larger is a span of its own (per
// chunk), whose blocks the GPU can hash where they lie.
constexpr std::uint64_t join_below = image::write_block_size;

// Whether the memory [addr, addr + size) is mapped here (a gap between two pieces may be copied along).
using readable_fn = std::function<bool(std::uint64_t, std::uint64_t)>;
// Where this tool reads the program's memory at `addr`: the same address, unless another program's memory took
// that range here first (the ranks of a job on one device, held_memory.hpp).
using local_fn = std::function<CUdeviceptr(std::uint64_t addr)>;

// Cuts every pool's allocations into pieces of at most chunk_bytes and packs them into chunks, in
// manifest order, joining nearby pieces into one span where `readable` says the memory between them
// is mapped. Each span is one extent of the manifest (m's extents are replaced, its data_files set to
// `files`). Writers take chunks in that order, so each data file gets its extents in it.
std::vector<chunk> plan_chunks(image::manifest& m, std::uint64_t chunk_bytes, std::uint32_t files,
                               const readable_fn& readable);

// The image's bytes: every span's stored bytes (without the gaps copied along).
std::uint64_t stored_bytes(const std::vector<chunk>& chunks);

// Packs a span's pieces together at its start in the buffer: its stored bytes. The pieces lie in
// address order, each at or after where it goes, so moving them front to back overwrites nothing
// still needed.
const unsigned char* pack(unsigned char* buffer, const chunk& c, const span& sp);

// What becomes of one block of a span: copied out of the program's memory and written, left to the parent
// (its checksum equals the parent's block at the same place), or recorded as a zero block (the GPU found it
// all zeros): neither of the last two is copied.
enum class block_fate { copy, parent, zero };

// Calls f(first, end, fate, from, to) for each longest run of blocks [first, end) of an extent of `stored`
// bytes that share a fate: left to the parent where their checksums (`sums`) equal those of the parent's
// extent `old`, block for block; otherwise zero where `zeros` (a byte a block, may be null) says so; otherwise
// copied. [from, to) is the run's byte range in the extent.
template <typename F>
void for_each_block_run(const std::uint64_t* sums, const unsigned char* zeros, const image::extent* old,
                        std::uint64_t stored, F&& f) {
  const std::size_t count = image::block_count(stored, image::write_block_size);
  auto fate = [&](std::size_t k) {
    if (old != nullptr && sums[k] == old->blocks[k].checksum) return block_fate::parent;
    return zeros != nullptr && zeros[k] != 0 ? block_fate::zero : block_fate::copy;
  };
  for (std::size_t k = 0; k < count;) {
    const block_fate first = fate(k);
    std::size_t end = k + 1;
    while (end < count && fate(end) == first) ++end;
    f(k, end, first, k * image::write_block_size, std::min<std::uint64_t>(end * image::write_block_size, stored));
    k = end;
  }
}

// The GPU snapshot holds the last chunks, as many as fit in `room` bytes: going back from chunk `first` (all
// before it), each chunk c of bytes_of(c) bytes while it fits. Returns the first chunk in the snapshot.
template <typename BytesOf>
std::size_t first_in_snapshot(std::size_t first, std::uint64_t room, BytesOf&& bytes_of) {
  for (; first > 0 && bytes_of(first - 1) <= room;) room -= bytes_of(--first);
  return first;
}

// Where each chunk's bytes are in a snapshot at `base` made before the hold (the same layout as in a
// staging buffer, the chunks from `first` on one after the other); 0 for the chunks before `first`.
std::vector<CUdeviceptr> snapshot_places(const std::vector<chunk>& chunks, std::size_t first, CUdeviceptr base);

// What of a chunk leaves the program's memory in one copy (offset: in the chunk's buffer).
struct copy_run {
  CUdeviceptr addr;  // in the program's memory
  std::uint64_t offset, bytes;
  CUdeviceptr in_snapshot = 0;  // where the snapshot holds it, if it does
};

// What of each chunk leaves the program's memory, as runs of one copy each.
struct copy_runs {
  // Every run read at local(addr) instead of addr: where the tool mapped the program's memory.
  void read_at(const local_fn& local) {
    for (auto& runs : of)
      for (copy_run& r : runs) r.addr = local(r.addr);
  }
  std::vector<std::vector<copy_run>> of;  // per chunk; none: every block zero or unchanged, no copy
  std::size_t changed_chunks = 0;         // chunks with at least one run
  std::uint64_t changed_bytes = 0;        // in all runs
  std::uint64_t uncopied_bytes = 0;       // unchanged blocks left on the GPU

  std::uint64_t bytes_of(std::size_t c) const {
    std::uint64_t n = 0;
    for (const copy_run& r : of[c]) n += r.bytes;
    return n;
  }
  // Once the blocks to copy are known (the GPU's checksums): the runs of the chunks from `first` on, packed
  // one after the other in a snapshot at `base`.
  void place_in_snapshot(std::size_t first, CUdeviceptr base) {
    CUdeviceptr at = base;
    for (std::size_t c = first; c < of.size(); ++c)
      for (copy_run& r : of[c]) {
        r.in_snapshot = at;
        at += r.bytes;
      }
  }
};

// The GPU's verdict on span k of chunk c, for plan_copy_runs: its block checksums and zero flags (null: the
// GPU did not hash it), and the parent's extent they are compared with (null: none).
struct span_blocks {
  const std::uint64_t* sums = nullptr;
  const unsigned char* zeros = nullptr;
  const image::extent* old = nullptr;
};

// The runs of every chunk. blocks_of(c, k) gives span k of chunk c's span_blocks: without checksums the span is
// copied whole; with them, only its blocks of fate copy (for_each_block_run). `snapshot_at`: snapshot_places(),
// each run is placed there at its offset.
template <typename BlocksOf>
copy_runs plan_copy_runs(const std::vector<chunk>& chunks, const std::vector<CUdeviceptr>& snapshot_at,
                         BlocksOf&& blocks_of) {
  copy_runs out;
  out.of.resize(chunks.size());
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    std::vector<copy_run>& runs = out.of[c];
    auto add = [&](CUdeviceptr addr, std::uint64_t offset, std::uint64_t bytes) {
      runs.push_back({addr, offset, bytes, snapshot_at[c] != 0 ? snapshot_at[c] + offset : 0});
      out.changed_bytes += bytes;
    };
    for (std::size_t k = 0; k < chunks[c].spans.size(); ++k) {
      const span& sp = chunks[c].spans[k];
      const span_blocks b = blocks_of(c, k);
      if (b.sums == nullptr) {
        add(sp.addr, sp.offset, sp.size);
        continue;
      }
      for_each_block_run(b.sums, b.zeros, b.old, sp.stored,
                         [&](std::size_t, std::size_t, block_fate fate, std::uint64_t from, std::uint64_t to) {
                           if (fate == block_fate::parent)
                             out.uncopied_bytes += to - from;
                           else if (fate == block_fate::copy)
                             add(sp.addr + from, sp.offset + from, to - from);
                         });
    }
    if (!runs.empty()) ++out.changed_chunks;
  }
  return out;
}

}  // namespace vmmckpt::ckpt
