// tables.bin of a format 3 image: the pools' allocation and extent tables as fixed little-endian records.
//
// A million allocations are about 100 MB of JSON but 24 bytes each here, read at memory speed: what keeps
// verify, restore and the hold of a suspend short for programs of many small allocations.
#include <cstring>

#include "image_detail.hpp"
#include "vmmckpt/pool/alloc_api.hpp"
#include "vmmckpt/support/little_endian.hpp"

namespace vmmckpt::image::detail {
namespace {

void put(std::string& out, std::size_t at, std::uint64_t v, int bytes) {
  put_le(reinterpret_cast<unsigned char*>(out.data()) + at, v, bytes);
}

std::uint64_t get(const std::string& in, std::size_t at, int bytes) {
  return get_le(reinterpret_cast<const unsigned char*>(in.data()) + at, bytes);
}

}  // namespace

std::string encode_tables(const manifest& m) {
  std::uint64_t allocations = 0, extents = 0, blocks = 0;
  for (const auto& p : m.pools) {
    allocations += p.allocations.size();
    extents += p.extents.size();
    for (const auto& e : p.extents) blocks += e.blocks.size();
  }
  std::string out(tables_header_size + allocations * allocation_record_size + extents * extent_record_size +
                      blocks * block_record_size,
                  '\0');
  std::memcpy(out.data(), tables_magic.data(), tables_magic.size());
  put(out, 12, m.format, 4);
  put(out, 16, allocations, 8);
  put(out, 24, extents, 8);
  put(out, 32, m.pools.size(), 8);
  put(out, 40, blocks, 8);  // zero before format 5
  std::size_t at = tables_header_size;
  for (const auto& p : m.pools) {
    for (const auto& a : p.allocations) {
      put_allocation_record(reinterpret_cast<unsigned char*>(out.data()) + at,
                            {a.addr, a.size, static_cast<std::uint32_t>(a.api), 0});
      at += allocation_record_size;
    }
    for (const auto& e : p.extents) {
      put(out, at, e.addr, 8);
      put(out, at + 8, e.size, 8);
      put(out, at + 16, e.stored, 8);
      put(out, at + 24, e.offset, 8);
      put(out, at + 32, e.checksum, 8);
      put(out, at + 40, e.file, 4);
      at += extent_record_size;
    }
    for (const auto& e : p.extents)
      for (const auto& b : e.blocks) {
        put(out, at, b.checksum, 8);
        put(out, at + 8, b.zero ? 2 : b.in_parent ? 1 : 0, 4);
        at += block_record_size;
      }
  }
  return out;
}

namespace {

// The header of tables.bin: its size, magic, version and counts are the manifest's, its reserved bytes zero.
// Counts are bounded by the file's size before anything is reserved: a manifest cannot make the reader
// allocate more than the tables it really has.
void check_tables_header(const std::string& bytes, const std::vector<std::uint64_t>& allocation_counts,
                         const std::vector<std::uint64_t>& extent_counts, const manifest& m) {
  std::uint64_t allocations = 0, extents = 0;
  const std::uint64_t most = bytes.size() / allocation_record_size;
  for (std::size_t p = 0; p < m.pools.size(); ++p) {
    if (allocation_counts[p] > most || extent_counts[p] > most || allocations > most || extents > most)
      fail("the manifest counts more records than " + std::to_string(bytes.size()) + " bytes can hold");
    allocations += allocation_counts[p];
    extents += extent_counts[p];
  }
  if (bytes.size() < tables_header_size) fail(std::to_string(bytes.size()) + " bytes, shorter than the 64-byte header");
  // Format 5: the block records, counted by the header; bounded by the file's size, then checked
  // against the extents' stored bytes as they are read.
  const std::uint64_t blocks = m.format >= 5 ? get(bytes, 40, 8) : 0;
  if (blocks > bytes.size() / block_record_size) fail("the header counts more block records than the file can hold");
  const std::uint64_t expected = tables_header_size + allocations * allocation_record_size +
                                 extents * extent_record_size + blocks * block_record_size;
  if (bytes.size() != expected)
    fail(std::to_string(bytes.size()) + " bytes, expected " + std::to_string(expected) + " (a 64-byte header, " +
         std::to_string(allocations) + " allocation, " + std::to_string(extents) + " extent and " +
         std::to_string(blocks) + " block records)");
  if (std::memcmp(bytes.data(), tables_magic.data(), tables_magic.size()) != 0) fail("bad magic (not vmmckpt tables)");
  if (get(bytes, 12, 4) != m.format)
    fail("version " + std::to_string(get(bytes, 12, 4)) + " does not match the manifest's format " +
         std::to_string(m.format));
  if (get(bytes, 16, 8) != allocations || get(bytes, 24, 8) != extents || get(bytes, 32, 8) != m.pools.size())
    fail("the header counts " + std::to_string(get(bytes, 16, 8)) + " allocations, " +
         std::to_string(get(bytes, 24, 8)) + " extents and " + std::to_string(get(bytes, 32, 8)) +
         " pools; the manifest " + std::to_string(allocations) + ", " + std::to_string(extents) + " and " +
         std::to_string(m.pools.size()));
  for (std::size_t i = m.format >= 5 ? 48 : 40; i < tables_header_size; ++i)
    if (bytes[i] != 0) fail("reserved header byte " + std::to_string(i) + " is not zero");
}

// Pool p's allocation records from `at` on; `at` moves past them.
void read_allocations(const std::string& bytes, std::size_t& at, std::size_t p, pool& pl) {
  for (std::size_t k = 0; k < pl.allocations.size(); ++k, at += allocation_record_size) {
    allocation& a = pl.allocations[k];
    const allocation_record r = get_allocation_record(reinterpret_cast<const unsigned char*>(bytes.data()) + at);
    a.addr = r.addr;
    a.size = r.size;
    const auto api = alloc_api_from_value(r.api);
    if (!api)
      fail("pools[" + std::to_string(p) + "].allocations[" + std::to_string(k) + "].api " + std::to_string(r.api) +
           " is not an allocation API vmmckpt records");
    a.api = *api;
    if (r.reserved != 0)
      fail("pools[" + std::to_string(p) + "].allocations[" + std::to_string(k) + "]: reserved bytes are not zero");
  }
}

// Pool p's extent records from `at` on; `at` moves past them.
void read_extents(const std::string& bytes, std::size_t& at, std::size_t p, pool& pl) {
  for (std::size_t k = 0; k < pl.extents.size(); ++k, at += extent_record_size) {
    extent& e = pl.extents[k];
    e.addr = get(bytes, at, 8);
    e.size = get(bytes, at + 8, 8);
    e.stored = get(bytes, at + 16, 8);
    e.offset = get(bytes, at + 24, 8);
    e.checksum = get(bytes, at + 32, 8);
    e.file = static_cast<std::uint32_t>(get(bytes, at + 40, 4));
    if (get(bytes, at + 44, 4) != 0) fail(extent_name(p, k) + ": reserved bytes are not zero");
  }
}

// Format 5: the block records of pool p's extents, one per block of each one's stored bytes; `at` moves past them.
void read_blocks(const std::string& bytes, std::size_t& at, std::size_t p, pool& pl, std::uint64_t block_size) {
  for (std::size_t k = 0; k < pl.extents.size(); ++k) {
    extent& e = pl.extents[k];
    const std::uint64_t n = block_count(e.stored, block_size);
    if (n > (bytes.size() - at) / block_record_size)
      fail(extent_name(p, k) + ": its " + std::to_string(e.stored) +
           " stored bytes need more block records than remain");
    e.blocks.resize(n);
    for (auto& b : e.blocks) {
      b.checksum = get(bytes, at, 8);
      const std::uint64_t where = get(bytes, at + 8, 4);
      if (where > 2)
        fail(extent_name(p, k) + ": a block record's place is " + std::to_string(where) + ", expected 0, 1 or 2");
      b.in_parent = where == 1;
      b.zero = where == 2;
      if (get(bytes, at + 12, 4) != 0) fail(extent_name(p, k) + ": a block record's reserved bytes are not zero");
      at += block_record_size;
    }
  }
}

}  // namespace

void decode_tables(const std::string& bytes, const std::vector<std::uint64_t>& allocation_counts,
                   const std::vector<std::uint64_t>& extent_counts, manifest& m) {
  check_tables_header(bytes, allocation_counts, extent_counts, m);
  std::size_t at = tables_header_size;
  for (std::size_t p = 0; p < m.pools.size(); ++p) {
    pool& pl = m.pools[p];
    pl.allocations.resize(allocation_counts[p]);
    read_allocations(bytes, at, p, pl);
    pl.extents.resize(extent_counts[p]);
    read_extents(bytes, at, p, pl);
    if (m.format >= 5) read_blocks(bytes, at, p, pl, m.block_size);
  }
  if (at != bytes.size()) fail("the header counts more block records than the extents have");
}

}  // namespace vmmckpt::image::detail
