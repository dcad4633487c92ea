// Every driver entry point that submits GPU work (launches, graphs, copies, memsets, stream writes) passes the gate;
// copies first give the devices taking part access to the pools involved (peer_access.hpp).
//
// cudart (shared and static), cuBLAS, NCCL and PyTorch reach these through the
// resolvers, which hand out the wrappers below; programs linked to libcuda
// reach them through these exported names. The list is generated from the
// toolkit (shim/gen/gen_gated_entry_points.py).
#define __CUDA_API_VERSION_INTERNAL 1  // exact exported names, no macro renaming
#include <cuda.h>

#include <atomic>
#include <string_view>
#include <unordered_map>

#include "entry/entry_points.hpp"
#include "core/gate.hpp"
#include "entry/gated_entry_points.hpp"
#include "entry/peer_access.hpp"
#include "operations/restore.hpp"

namespace vmmckpt::detail {
namespace {

void* load_real(std::atomic<void*>& slot, const char* name) noexcept {
  void* p = slot.load(std::memory_order_acquire);
  if (p == nullptr && driver_library() != nullptr) {
    p = real_dlsym(driver_library(), name);
    slot.store(p, std::memory_order_release);
  }
  return p;
}

}  // namespace
}  // namespace vmmckpt::detail

// `name` is declared, `params` and `args` are parenthesized lists already: none is an expression to parenthesize.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define VMMCKPT_GATED(name, params, args)                                                                 \
  namespace vmmckpt::detail::real {                                                                       \
  std::atomic<void*> name{nullptr};                                                                       \
  }                                                                                                       \
  VMMCKPT_EXPORT CUresult CUDAAPI name params {                                                           \
    using vmmckpt_real_t = CUresult(CUDAAPI*) params;                                                     \
    auto vmmckpt_real =                                                                                   \
        reinterpret_cast<vmmckpt_real_t>(vmmckpt::detail::load_real(vmmckpt::detail::real::name, #name)); \
    if (vmmckpt_real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;                                       \
    return vmmckpt::detail::guarded(CUDA_ERROR_UNKNOWN, [&] {                                             \
      if (!vmmckpt::detail::restore_ready()) return CUDA_ERROR_OUT_OF_MEMORY;                             \
      vmmckpt::detail::gate_scope vmmckpt_scope;                                                          \
      vmmckpt::detail::before_copy<vmmckpt::detail::copy_shape_of(#name)> args;                           \
      return vmmckpt_real args;                                                                           \
    });                                                                                                   \
  }
// NOLINTEND(bugprone-macro-parentheses)
#include "entry/gated_entry_points.inc"
#undef VMMCKPT_GATED

namespace vmmckpt::detail {
namespace {

struct gated_entry {
  std::string_view name;
  void* ours;
  std::atomic<void*>* real;
  const char* c_name;
};

const gated_entry gated_entries[] = {
#define VMMCKPT_GATED(name, params, args) {#name, reinterpret_cast<void*>(&::name), &real::name, #name},
#include "entry/gated_entry_points.inc"
#undef VMMCKPT_GATED
};

// Real pointer -> our wrapper, built once: the resolvers match what the driver
// returned, so whatever version or stream flavour it chose gets its own gate.
const std::unordered_map<void*, void*>& by_real_pointer() {
  static const auto map = [] {
    std::unordered_map<void*, void*> m;
    for (const auto& e : gated_entries)
      if (void* p = load_real(*e.real, e.c_name)) m.emplace(p, e.ours);
    return m;
  }();
  return map;
}

}  // namespace

void* gated_substitute_for_pointer(void* real) noexcept {
  // Built on the first lookup; out of memory then, nothing is substituted (the driver's own passes).
  static const std::unordered_map<void*, void*>* map_or_null =
      []() noexcept -> const std::unordered_map<void*, void*>* {
    try {
      return &by_real_pointer();
    } catch (...) {
      return nullptr;
    }
  }();
  if (map_or_null == nullptr) return nullptr;
  const auto& map = *map_or_null;
  const auto it = map.find(real);
  return it == map.end() ? nullptr : it->second;
}

void* gated_substitute_for_name(std::string_view name) noexcept {
  for (const auto& e : gated_entries)
    if (e.name == name) return e.ours;
  return nullptr;
}

}  // namespace vmmckpt::detail
