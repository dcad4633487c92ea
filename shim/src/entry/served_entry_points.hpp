// The entry points the shim serves, from the one list in served_entry_points.inc, for the resolvers and the tests.
#pragma once

#include <span>
#include <string_view>

namespace vmmckpt::detail {

struct served_entry {
  std::string_view symbol;  // exported name, as dlsym is asked for it
  void* ours;
  const char* proc_name;  // as cuGetProcAddress is asked for it; null: only reached as another entry's twin
  int since;              // the CUDA version whose ABI `ours` implements
  const char* twin;       // exported name of the per-thread-default-stream twin, or null
};

std::span<const served_entry> served_entries() noexcept;
// The entry exported as `symbol`, or null.
const served_entry* served_by_symbol(std::string_view symbol) noexcept;

}  // namespace vmmckpt::detail
