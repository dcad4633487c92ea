// XXH3-64 (seed 0, default secret) in plain portable code that compiles for the host and, under nvcc, for the GPU:
// the block checksum function of image format 5 (docs/image-format.md, "Blocks"), so a kernel computes exactly
// what image::block_checksum (xxhash.h) does. tests/unit/xxh3_portable_test.cpp checks the two agree.
//
// Written after xxHash's scalar code paths (BSD 2-clause, Yann Collet); same results, no SIMD, no seed.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define VMMCKPT_HD __host__ __device__ inline
#else
#define VMMCKPT_HD inline
#endif

namespace vmmckpt::xxh3 {

using u8 = unsigned char;
using u32 = std::uint32_t;
using u64 = std::uint64_t;

constexpr u32 prime32_1 = 0x9E3779B1U, prime32_2 = 0x85EBCA77U, prime32_3 = 0xC2B2AE3DU;
constexpr u64 prime64_1 = 0x9E3779B185EBCA87ULL, prime64_2 = 0xC2B2AE3D27D4EB4FULL, prime64_3 = 0x165667B19E3779F9ULL,
              prime64_4 = 0x85EBCA77C2B2AE63ULL, prime64_5 = 0x27D4EB2F165667C5ULL;
constexpr u64 prime_mx1 = 0x165667919E3779F9ULL, prime_mx2 = 0x9FB21C651E98DF25ULL;
constexpr std::size_t secret_size = 192;

// The default secret: the bytes once, in constant memory on the device (one read broadcast to a warp)
// and in a table on the host.
#define VMMCKPT_XXH3_SECRET                                                                                         \
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, \
      0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc,   \
      0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24,   \
      0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88,   \
      0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef,   \
      0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7,   \
      0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73,   \
      0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17,   \
      0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe,   \
      0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95,   \
      0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
#if defined(__CUDACC__)
__constant__ u8 device_secret[secret_size] = {VMMCKPT_XXH3_SECRET};
#endif
VMMCKPT_HD u8 secret_byte(std::size_t i) {
#if defined(__CUDA_ARCH__)
  return device_secret[i];
#else
  static constexpr u8 k[secret_size] = {VMMCKPT_XXH3_SECRET};
  return k[i];
#endif
}

VMMCKPT_HD u32 read32(const u8* p) {
  return static_cast<u32>(p[0]) | static_cast<u32>(p[1]) << 8 | static_cast<u32>(p[2]) << 16 |
         static_cast<u32>(p[3]) << 24;
}
VMMCKPT_HD u64 read64(const u8* p) {
#if defined(__CUDA_ARCH__)
  // One load where it is aligned (a block's bytes almost always are): the GPU is little-endian.
  if ((reinterpret_cast<std::uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const u64*>(p);
#endif
  return static_cast<u64>(read32(p)) | static_cast<u64>(read32(p + 4)) << 32;
}
VMMCKPT_HD u32 secret32(std::size_t at) {
  return static_cast<u32>(secret_byte(at)) | static_cast<u32>(secret_byte(at + 1)) << 8 |
         static_cast<u32>(secret_byte(at + 2)) << 16 | static_cast<u32>(secret_byte(at + 3)) << 24;
}
VMMCKPT_HD u64 secret64(std::size_t at) {
  return static_cast<u64>(secret32(at)) | static_cast<u64>(secret32(at + 4)) << 32;
}
VMMCKPT_HD u64 rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }
VMMCKPT_HD u64 swap64(u64 x) {
  x = ((x & 0x00000000FFFFFFFFULL) << 32) | ((x & 0xFFFFFFFF00000000ULL) >> 32);
  x = ((x & 0x0000FFFF0000FFFFULL) << 16) | ((x & 0xFFFF0000FFFF0000ULL) >> 16);
  return ((x & 0x00FF00FF00FF00FFULL) << 8) | ((x & 0xFF00FF00FF00FF00ULL) >> 8);
}
VMMCKPT_HD u64 mul128_fold64(u64 a, u64 b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<u64>(p) ^ static_cast<u64>(p >> 64);
#endif
}
VMMCKPT_HD u64 xxh64_avalanche(u64 h) {
  h ^= h >> 33;
  h *= prime64_2;
  h ^= h >> 29;
  h *= prime64_3;
  return h ^ (h >> 32);
}
VMMCKPT_HD u64 avalanche(u64 h) {
  h ^= h >> 37;
  h *= prime_mx1;
  return h ^ (h >> 32);
}
VMMCKPT_HD u64 rrmxmx(u64 h, u64 len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= prime_mx2;
  h ^= (h >> 35) + len;
  h *= prime_mx2;
  return h ^ (h >> 28);
}

VMMCKPT_HD u64 len_0to16(const u8* p, std::size_t len) {
  if (len > 8) {
    const u64 lo = read64(p) ^ (secret64(24) ^ secret64(32));
    const u64 hi = read64(p + len - 8) ^ (secret64(40) ^ secret64(48));
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
  }
  if (len >= 4) {
    const u64 in = read32(p + len - 4) + (static_cast<u64>(read32(p)) << 32);
    return rrmxmx(in ^ (secret64(8) ^ secret64(16)), len);
  }
  if (len > 0) {
    const u32 combined = (static_cast<u32>(p[0]) << 16) | (static_cast<u32>(p[len >> 1]) << 24) |
                         static_cast<u32>(p[len - 1]) | (static_cast<u32>(len) << 8);
    return xxh64_avalanche(static_cast<u64>(combined) ^ static_cast<u64>(secret32(0) ^ secret32(4)));
  }
  return xxh64_avalanche(secret64(56) ^ secret64(64));
}

VMMCKPT_HD u64 mix16(const u8* p, std::size_t secret_at) {
  return mul128_fold64(read64(p) ^ secret64(secret_at), read64(p + 8) ^ secret64(secret_at + 8));
}

VMMCKPT_HD u64 len_17to128(const u8* p, std::size_t len) {
  u64 acc = len * prime64_1;
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        acc += mix16(p + 48, 96);
        acc += mix16(p + len - 64, 112);
      }
      acc += mix16(p + 32, 64);
      acc += mix16(p + len - 48, 80);
    }
    acc += mix16(p + 16, 32);
    acc += mix16(p + len - 32, 48);
  }
  acc += mix16(p, 0);
  acc += mix16(p + len - 16, 16);
  return avalanche(acc);
}

VMMCKPT_HD u64 len_129to240(const u8* p, std::size_t len) {
  u64 acc = len * prime64_1;
  const std::size_t rounds = len / 16;
  for (std::size_t i = 0; i < 8; ++i) acc += mix16(p + 16 * i, 16 * i);
  acc = avalanche(acc);
  for (std::size_t i = 8; i < rounds; ++i) acc += mix16(p + 16 * i, 16 * (i - 8) + 3);
  acc += mix16(p + len - 16, 136 - 17);
  return avalanche(acc);
}

// One 64-byte stripe into the 8 accumulators, with the secret from `secret_at`.
VMMCKPT_HD void accumulate_512(u64* acc, const u8* p, std::size_t secret_at) {
  for (int i = 0; i < 8; ++i) {
    const u64 v = read64(p + 8 * i);
    const u64 key = v ^ secret64(secret_at + 8 * static_cast<std::size_t>(i));
    acc[i ^ 1] += v;
    acc[i] += static_cast<u64>(static_cast<u32>(key)) * (key >> 32);
  }
}

VMMCKPT_HD void scramble(u64* acc) {
  for (int i = 0; i < 8; ++i) {
    u64 a = acc[i];
    a ^= a >> 47;
    a ^= secret64(secret_size - 64 + 8 * static_cast<std::size_t>(i));
    acc[i] = a * prime32_1;
  }
}

VMMCKPT_HD u64 hash_long(const u8* p, std::size_t len) {
  u64 acc[8] = {prime32_3, prime64_1, prime64_2, prime64_3, prime64_4, prime32_2, prime64_5, prime32_1};
  constexpr std::size_t stripes_per_block = (secret_size - 64) / 8;
  constexpr std::size_t block_len = 64 * stripes_per_block;
  const std::size_t blocks = (len - 1) / block_len;
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t s = 0; s < stripes_per_block; ++s) accumulate_512(acc, p + b * block_len + s * 64, s * 8);
    scramble(acc);
  }
  const std::size_t stripes = ((len - 1) - block_len * blocks) / 64;
  for (std::size_t s = 0; s < stripes; ++s) accumulate_512(acc, p + blocks * block_len + s * 64, s * 8);
  accumulate_512(acc, p + len - 64, secret_size - 64 - 7);
  u64 result = len * prime64_1;
  for (int i = 0; i < 4; ++i)
    result += mul128_fold64(acc[2 * i] ^ secret64(11 + 16 * static_cast<std::size_t>(i)),
                            acc[2 * i + 1] ^ secret64(11 + 16 * static_cast<std::size_t>(i) + 8));
  return avalanche(result);
}

// XXH3_64bits(p, len): what image::block_checksum computes.
VMMCKPT_HD u64 hash64(const void* data, std::size_t len) {
  const u8* p = static_cast<const u8*>(data);
  if (len <= 16) return len_0to16(p, len);
  if (len <= 128) return len_17to128(p, len);
  if (len <= 240) return len_129to240(p, len);
  return hash_long(p, len);
}

}  // namespace vmmckpt::xxh3
