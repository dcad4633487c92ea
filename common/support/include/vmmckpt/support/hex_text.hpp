// Hex text as images, the control channel and messages write addresses and checksums, and its strict parsing.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace vmmckpt {

// "0x2000": how an address is written everywhere (manifests, control messages, messages to users).
inline std::string hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  char buf[18];
  char* p = buf + sizeof buf;
  do {
    *--p = digits[v & 0xf];
    v >>= 4;
  } while (v != 0);
  *--p = 'x';
  *--p = '0';
  return std::string(p, buf + sizeof buf);
}

// Exactly 16 digits, no prefix: how a checksum is written.
inline std::string hex16(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
  return s;
}

// 64 random bits as 16 hex digits: the unguessable part of temporary names and of image ids.
inline std::string random_hex16() {
  std::random_device rd;
  return hex16((static_cast<std::uint64_t>(rd()) << 32) | rd());
}

// 1 to 16 hex digits and nothing else (so no value can overflow).
inline bool parse_hex_digits(std::string_view s, std::uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  out = v;
  return true;
}

// An address as hex() writes it: "0x" (or "0X") and 1 to 16 hex digits.
inline bool parse_address(std::string_view s, std::uint64_t& out) {
  return s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && parse_hex_digits(s.substr(2), out);
}

}  // namespace vmmckpt
