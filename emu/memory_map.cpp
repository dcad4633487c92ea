// Lookups in the emulator's address table, used to validate the pointers given to copies and memsets.
#include "memory_map.hpp"

#include <mutex>

namespace vmmckpt::emu {

memory_table& memory() {
  static memory_table* table = new memory_table;  // never destroyed: see state.cpp
  return *table;
}

region* memory_table::find(std::uintptr_t p) {
  auto it = regions.upper_bound(p);
  if (it == regions.begin()) return nullptr;
  --it;
  return p < it->second.base + it->second.size ? &it->second : nullptr;
}

reservation* memory_table::find_reservation(std::uintptr_t p) {
  auto it = reservations.upper_bound(p);
  if (it == reservations.begin()) return nullptr;
  --it;
  return p < it->second.base + it->second.size ? &it->second : nullptr;
}

bool memory_table::overlaps(std::uintptr_t p, std::size_t n) {
  auto it = regions.lower_bound(p);
  if (it != regions.end() && it->first < p + n) return true;
  if (it == regions.begin()) return false;
  --it;
  return it->second.base + it->second.size > p;
}

static bool region_allows(const region& r, access_need need) {
  if (r.kind != region_kind::vmm_mapping) return true;
  unsigned best = 0;
  for (unsigned char a : r.access) best |= a;
  return need == access_need::read ? (best & CU_MEM_ACCESS_FLAGS_PROT_READ) != 0
                                   : best == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

// Walks [p, p+n) across adjacent regions (a copy may span several VMM mappings laid out back to back).
static bool covered(memory_table& t, std::uintptr_t p, std::size_t n, access_need need) {
  std::uintptr_t at = p;
  const std::uintptr_t end = p + n;
  while (at < end) {
    region* r = t.find(at);
    if (r == nullptr || !region_allows(*r, need)) return false;
    at = r->end();
  }
  return true;
}

CUresult check_device_range(std::uintptr_t p, std::size_t n, access_need need) {
  if (n == 0) return CUDA_SUCCESS;
  if (p == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  return covered(t, p, n, need) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult check_any_range(std::uintptr_t p, std::size_t n, access_need need) {
  if (n == 0) return CUDA_SUCCESS;
  if (p == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  const bool known = t.find(p) != nullptr || t.find_reservation(p) != nullptr;
  if (!known) return CUDA_SUCCESS;  // pageable host memory: the caller's responsibility, as on a GPU
  return covered(t, p, n, need) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

bool is_page_locked(std::uintptr_t p, std::size_t n) {
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  region* r = t.find(p);
  return r != nullptr && (r->kind == region_kind::host_pinned || r->kind == region_kind::host_registered) &&
         p + n <= r->end();
}

}  // namespace vmmckpt::emu
