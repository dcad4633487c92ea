// Fixed-width little-endian fields in byte buffers: how every binary record of vmmckpt is laid out,
// whatever the host, so that images and messages read the same on every machine.
#pragma once

#include <bit>
#include <cstddef>
#include <cstring>
#include <cstdint>

namespace vmmckpt {

// `bytes` is 1 to 8; on a little-endian host each is one copy (tables of a million records are
// read and written while a program is held).
inline void put_le(unsigned char* out, std::uint64_t v, int bytes) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out, &v, static_cast<std::size_t>(bytes));
  } else {
    for (int i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
  }
}

inline std::uint64_t get_le(const unsigned char* in, int bytes) noexcept {
  std::uint64_t v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, in, static_cast<std::size_t>(bytes));
  } else {
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  }
  return v;
}

// One allocation as the image's tables.bin and the control channel's allocation table hold it:
// u64 address, u64 size the program asked for, u32 API (alloc_api's value), u32 zero.
inline constexpr std::size_t allocation_record_size = 24;

struct allocation_record {
  std::uint64_t addr = 0, size = 0;
  std::uint32_t api = 0;
  std::uint32_t reserved = 0;  // must be zero
};

inline void put_allocation_record(unsigned char* out, const allocation_record& r) noexcept {
  put_le(out, r.addr, 8);
  put_le(out + 8, r.size, 8);
  put_le(out + 16, r.api, 4);
  put_le(out + 20, 0, 4);
}

inline allocation_record get_allocation_record(const unsigned char* in) noexcept {
  return {get_le(in, 8), get_le(in + 8, 8), static_cast<std::uint32_t>(get_le(in + 16, 4)),
          static_cast<std::uint32_t>(get_le(in + 20, 4))};
}

}  // namespace vmmckpt
