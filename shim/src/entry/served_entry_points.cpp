// The table of served entry points, built from served_entry_points.inc.
#include "entry/served_entry_points.hpp"

#include "entry/undeclared_entry_points.hpp"
#include "vmmckpt/support/driver_api.hpp"

namespace vmmckpt::detail {
namespace {

const served_entry entries[] = {
#define VMMCKPT_SERVED_DRIVER(symbol, proc_name, since, twin) \
  {#symbol, reinterpret_cast<void*>(&::symbol), proc_name, since, twin},
#define VMMCKPT_SERVED_RUNTIME(symbol) {#symbol, reinterpret_cast<void*>(&::symbol), nullptr, 0, nullptr},
#include "entry/served_entry_points.inc"
#undef VMMCKPT_SERVED_DRIVER
#undef VMMCKPT_SERVED_RUNTIME
};

}  // namespace

std::span<const served_entry> served_entries() noexcept { return entries; }

const served_entry* served_by_symbol(std::string_view symbol) noexcept {
  for (const auto& e : entries)
    if (e.symbol == symbol) return &e;
  return nullptr;
}

}  // namespace vmmckpt::detail
