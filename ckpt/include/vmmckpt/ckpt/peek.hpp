// The CPU's window into a live program's GPU memory (docs/peek.md): peek reads a range of it, poke writes one,
// regions lists what there is to read. The same access rule as dump's: the program's owner, or root.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::ckpt {

// Copied below this, mapped above (when this tool has a CUDA driver): a copy costs the reader no driver and no
// GPU memory, a mapping costs a context but moves bulk at the GPU's speed.
inline constexpr std::uint64_t peek_map_above = 64ULL << 20;
inline constexpr std::chrono::seconds default_peek_hold{10};  // --deadline of --quiesce

// The range: `size` bytes at `addr` (0: to the end of its allocation), or, when `name` is given, `addr` is an offset
// into the range the program named so.
struct peek_options {
  pid_t pid = 0;
  std::uint64_t addr = 0, size = 0;
  std::string name;
  control::peek_order order = control::peek_order::live;
  std::optional<control::peek_path> via;  // none: chosen by size (peek_map_above)
  std::chrono::milliseconds hold_deadline{default_peek_hold};
};
struct peek_result {
  control::peek_reply reply;
  std::string bytes;  // reply.range.size of them
  double seconds = 0;
};
peek_result peek(const peek_options& options);

struct poke_options {
  pid_t pid = 0;
  std::uint64_t addr = 0;
  std::string name;
  control::peek_order order = control::peek_order::quiesce;
  std::chrono::milliseconds hold_deadline{default_peek_hold};
  std::string bytes;
};
control::poke_reply poke(const poke_options& options);

control::regions_reply regions(pid_t pid);

}  // namespace vmmckpt::ckpt
