// Lookup of the gated entry points for the resolvers.
#pragma once

#include <string_view>

namespace vmmckpt::detail {

// Our gated wrapper for a real driver function pointer, or null.
void* gated_substitute_for_pointer(void* real) noexcept;
// Our gated wrapper for an exported driver name (exact ABI name), or null.
void* gated_substitute_for_name(std::string_view name) noexcept;

}  // namespace vmmckpt::detail
