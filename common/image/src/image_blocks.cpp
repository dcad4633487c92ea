// Format 5's block checksums: the function a block's checksum is, how an extent's checksum combines them, streamed.
#include <algorithm>

#include "image_detail.hpp"
#include "vmmckpt/image/image.hpp"

namespace vmmckpt::image {

std::uint64_t block_checksum(const void* data, std::size_t size) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  detail::checksum_update(&state, data, size);
  return XXH3_64bits_digest(&state);
}

std::uint64_t combined_checksum(const std::vector<block>& blocks) {
  std::vector<unsigned char> le(blocks.size() * 8);
  for (std::size_t k = 0; k < blocks.size(); ++k) put_le(le.data() + 8 * k, blocks[k].checksum, 8);
  return XXH3_64bits(le.data(), le.size());
}

std::uint64_t block_count(std::uint64_t stored, std::uint64_t block_bytes) {
  return block_bytes == 0 ? 0 : stored / block_bytes + (stored % block_bytes != 0);
}

std::uint64_t bytes_here(const extent& e, std::uint64_t block_bytes) {
  std::uint64_t here = e.stored;
  for (std::size_t i = 0; i < e.blocks.size(); ++i)
    if (e.blocks[i].in_parent || e.blocks[i].zero) here -= std::min(block_bytes, e.stored - i * block_bytes);
  return here;
}

std::uint64_t zero_bytes(const extent& e, std::uint64_t block_bytes) {
  std::uint64_t zero = 0;
  for (std::size_t i = 0; i < e.blocks.size(); ++i)
    if (e.blocks[i].zero) zero += std::min(block_bytes, e.stored - i * block_bytes);
  return zero;
}

bool detail::all_zero(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  // Word by word where aligned; the first nonzero byte ends it, so data that is not zero costs almost nothing.
  while (size > 0 && reinterpret_cast<std::uintptr_t>(p) % sizeof(std::uint64_t) != 0) {
    if (*p != 0) return false;
    ++p;
    --size;
  }
  for (; size >= 8 * sizeof(std::uint64_t); size -= 8 * sizeof(std::uint64_t), p += 8 * sizeof(std::uint64_t)) {
    const auto* w = reinterpret_cast<const std::uint64_t*>(p);
    if ((w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) != 0) return false;
  }
  for (; size > 0; --size, ++p)
    if (*p != 0) return false;
  return true;
}

namespace {

std::uint64_t checksum_of_zeros(std::uint64_t size) {
  static const std::vector<unsigned char> page(1 << 16, 0);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (std::uint64_t left = size; left > 0;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, page.size()));
    detail::checksum_update(&state, page.data(), n);
    left -= n;
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace

std::uint64_t zero_block_checksum(std::uint64_t size) {
  // A whole block's is asked for again and again: computed once. Others (an extent's last block) as asked.
  static const std::uint64_t whole = checksum_of_zeros(write_block_size);
  return size == write_block_size ? whole : checksum_of_zeros(size);
}

std::uint64_t restored_bytes(const manifest& m) {
  std::uint64_t total = 0;
  for (const pool& p : m.pools)
    for (const extent& e : p.extents) total += e.stored;
  return total;
}

std::uint64_t data_bytes_of(const manifest& m) {
  std::uint64_t total = 0;
  for (const pool& p : m.pools)
    for (const extent& e : p.extents) total += m.format >= 5 ? bytes_here(e, m.block_size) : e.stored;
  return total;
}

std::uint64_t zero_bytes_of(const manifest& m) {
  std::uint64_t total = 0;
  for (const pool& p : m.pools)
    for (const extent& e : p.extents) total += zero_bytes(e, m.block_size);
  return total;
}

struct streaming_checksum::state {
  XXH3_state_t s;
  std::uint64_t block_bytes = 0;
  std::uint64_t in_block = 0;  // bytes of the current block hashed so far
  std::vector<block> blocks;   // finished blocks (block mode)
};

streaming_checksum::streaming_checksum(std::uint64_t block_bytes) : state_(std::make_unique<state>()) {
  XXH3_64bits_reset(&state_->s);
  state_->block_bytes = block_bytes;
}
streaming_checksum::~streaming_checksum() = default;

void streaming_checksum::update(const void* data, std::size_t size) {
  state& st = *state_;
  if (st.block_bytes == 0) {
    detail::checksum_update(&st.s, data, size);
    return;
  }
  auto p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(size, st.block_bytes - st.in_block));
    detail::checksum_update(&st.s, p, n);
    st.in_block += n;
    p += n;
    size -= n;
    if (st.in_block == st.block_bytes) {
      st.blocks.push_back({XXH3_64bits_digest(&st.s), false});
      XXH3_64bits_reset(&st.s);
      st.in_block = 0;
    }
  }
}

std::uint64_t streaming_checksum::value() const {
  const state& st = *state_;
  if (st.block_bytes == 0) return XXH3_64bits_digest(&st.s);
  return combined_checksum(st.in_block == 0 ? st.blocks : blocks());
}

void streaming_checksum::add_block(const block& b) { state_->blocks.push_back(b); }

bool streaming_checksum::at_block_boundary() const { return state_->in_block == 0; }

std::vector<block> streaming_checksum::blocks() const {
  const state& st = *state_;
  std::vector<block> all = st.blocks;
  if (st.in_block != 0) all.push_back({XXH3_64bits_digest(&st.s), false});
  return all;
}

}  // namespace vmmckpt::image
