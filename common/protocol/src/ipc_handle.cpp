// Encoding of the IPC handles the shim hands out (layout in docs/ipc.md).
#include "vmmckpt/protocol/ipc_handle.hpp"

#include <cstring>

#include "vmmckpt/support/little_endian.hpp"

namespace vmmckpt {
namespace {

constexpr unsigned char magic[8] = {'V', 'M', 'C', 'K', 'I', 'P', 'C', '1'};
constexpr std::size_t check_offset = 48;  // the check value covers the 48 bytes before it

// FNV-1a: the handle needs no cryptography (the exporter checks every field), only a way to tell our
// bytes from anybody else's.
std::uint64_t check_value(const unsigned char* p, std::size_t n) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace

void encode_ipc_handle(const ipc_handle& handle, unsigned char (&out)[ipc_handle_size]) noexcept {
  std::memset(out, 0, sizeof out);
  std::memcpy(out, magic, sizeof magic);
  put_le(out + 8, static_cast<std::uint32_t>(handle.exporter_pid), 4);
  put_le(out + 16, handle.exporter_start, 8);
  put_le(out + 24, handle.base, 8);
  put_le(out + 32, handle.size, 8);
  put_le(out + 40, handle.generation, 8);
  put_le(out + check_offset, check_value(out, check_offset), 8);
}

std::optional<ipc_handle> decode_ipc_handle(const unsigned char (&in)[ipc_handle_size]) noexcept {
  if (std::memcmp(in, magic, sizeof magic) != 0) return std::nullopt;
  if (get_le(in + check_offset, 8) != check_value(in, check_offset)) return std::nullopt;
  for (std::size_t i = check_offset + 8; i < ipc_handle_size; ++i)
    if (in[i] != 0) return std::nullopt;
  ipc_handle h;
  h.exporter_pid = static_cast<pid_t>(get_le(in + 8, 4));
  h.exporter_start = get_le(in + 16, 8);
  h.base = get_le(in + 24, 8);
  h.size = get_le(in + 32, 8);
  h.generation = get_le(in + 40, 8);
  if (h.exporter_pid <= 0 || h.size == 0 || h.generation == 0) return std::nullopt;
  return h;
}

}  // namespace vmmckpt
