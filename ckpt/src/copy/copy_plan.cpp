// The copy's plan: chunks, spans and pieces from the manifest; where they lie in the snapshot.
#include "copy/copy_plan.hpp"

#include <cstring>

namespace vmmckpt::ckpt {

std::vector<chunk> plan_chunks(image::manifest& m, std::uint64_t chunk_bytes, std::uint32_t files,
                               const readable_fn& readable) {
  std::vector<chunk> chunks(1);
  for (std::size_t p = 0; p < m.pools.size(); ++p) {
    auto& pool = m.pools[p];
    pool.extents.clear();
    bool pool_has_span = false;  // spans never join across pools
    for (const auto& a : pool.allocations) {
      for (std::uint64_t done = 0; done < a.size;) {
        chunk* c = &chunks.back();
        const std::uint64_t addr = a.addr + done;
        // Joined to the chunk's last span when the gap is small, mapped, and the chunk has room.
        if (pool_has_span && !c->spans.empty()) {
          span& last = c->spans.back();
          const std::uint64_t end = last.addr + last.size;
          if (last.joinable && a.size < join_below && addr >= end && addr - end <= max_gap &&
              c->bytes + (addr - end) < chunk_bytes && readable(end, addr - end)) {
            const std::uint64_t n = std::min(a.size - done, chunk_bytes - c->bytes - (addr - end));
            c->pieces.push_back({addr, n, last.offset + (addr - last.addr)});
            last.size = addr + n - last.addr;
            last.stored += n;
            ++last.piece_count;
            pool.extents.back().size = last.size;
            pool.extents.back().stored = last.stored;
            c->bytes = last.offset + last.size;
            done += n;
            continue;
          }
        }
        if (c->bytes == chunk_bytes) {
          chunks.emplace_back();
          c = &chunks.back();
        }
        const std::uint64_t n = std::min(a.size - done, chunk_bytes - c->bytes);
        c->spans.push_back({p, pool.extents.size(), addr, n, c->bytes, n, c->pieces.size(), 1, a.size < join_below});
        c->pieces.push_back({addr, n, c->bytes});
        pool.extents.push_back({addr, n, n, 0, 0, 0, {}});
        pool_has_span = true;
        c->bytes += n;
        done += n;
      }
    }
  }
  if (chunks.back().bytes == 0) chunks.pop_back();
  m.data_files = files;  // a file whose writer takes no chunk stays empty
  return chunks;
}

std::uint64_t stored_bytes(const std::vector<chunk>& chunks) {
  std::uint64_t total = 0;
  for (const auto& c : chunks)
    for (const span& sp : c.spans) total += sp.stored;
  return total;
}

const unsigned char* pack(unsigned char* buffer, const chunk& c, const span& sp) {
  unsigned char* at = buffer + sp.offset;
  for (std::size_t k = sp.first_piece; k < sp.first_piece + sp.piece_count; ++k) {
    const piece& pc = c.pieces[k];
    if (buffer + pc.offset != at) std::memmove(at, buffer + pc.offset, pc.size);
    at += pc.size;
  }
  return buffer + sp.offset;
}

std::vector<CUdeviceptr> snapshot_places(const std::vector<chunk>& chunks, std::size_t first, CUdeviceptr base) {
  std::vector<CUdeviceptr> at(chunks.size(), 0);
  for (std::size_t c = first, offset = 0; c < chunks.size(); offset += chunks[c++].bytes) at[c] = base + offset;
  return at;
}

}  // namespace vmmckpt::ckpt
