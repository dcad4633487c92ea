// cuda-ckpt merge: a chain of incremental images written as one full image, every block checked on the way.
#include <algorithm>
#include <memory>

#include "image_detail.hpp"
#include "vmmckpt/image/image_chain.hpp"

namespace vmmckpt::image {

manifest merge(const reader& chain, const std::filesystem::path& output, std::uint32_t files,
               const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  manifest m = chain.info();
  m.parent.reset();
  m.block_size = write_block_size;
  files = std::clamp<std::uint32_t>(files, 1, max_data_files);
  m.data_files = files;
  std::uint64_t total = 0, done = 0;
  for (const pool& p : m.pools)
    for (const extent& e : p.extents) total += e.stored;
  writer w(output, files);
  constexpr std::uint64_t piece = 8u << 20;
  auto buffer = std::make_unique_for_overwrite<unsigned char[]>(piece);
  std::uint32_t next_file = 0;
  for (std::size_t p = 0; p < m.pools.size(); ++p)
    for (std::size_t k = 0; k < m.pools[p].extents.size(); ++k) {
      const extent& from = chain.info().pools[p].extents[k];
      const std::uint32_t f = next_file;
      next_file = (next_file + 1) % files;
      // Every byte is checked against the chain's checksums (format 5: the blocks', combined) on the
      // way; the writer hashes it again for the new image.
      streaming_checksum sum(chain.info().format >= 5 ? chain.info().block_size : 0);
      w.begin_extent(f, from.addr, from.size, from.stored);
      for (std::uint64_t at = 0; at < from.stored;) {
        const std::uint64_t n = std::min(piece, from.stored - at);
        chain.read_part(from, at, n, buffer.get());
        sum.update(buffer.get(), n);
        w.write(f, buffer.get(), n);
        at += n;
        if (progress) progress(done += n, total);
      }
      chain.check_extent(from, sum.value());
      const extent e = w.end_extent(f);
      m.pools[p].extents[k] = e;
    }
  m.format = format_version;
  m.data_bytes = data_bytes_of(m);
  w.commit(m);
  m.image_id = w.image_id();
  return m;
}

}  // namespace vmmckpt::image
