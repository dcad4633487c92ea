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

static bool flags_allow(unsigned flags, access_need need) {
  return need == access_need::read ? (flags & CU_MEM_ACCESS_FLAGS_PROT_READ) != 0
                                   : flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

static bool region_allows(const region& r, access_need need, device_set devices) {
  if (r.kind != region_kind::vmm_mapping) return true;
  unsigned best = r.host_access;
  for (unsigned char a : r.access) best |= a;
  if (!flags_allow(best, need)) return false;
  for (std::size_t d = 0; d < r.access.size(); ++d)
    if ((devices & device_bit(static_cast<int>(d))) != 0 && !flags_allow(r.access[d], need)) return false;
  return true;
}

// Walks [p, p+n) across adjacent regions (a copy may span several VMM mappings laid out back to back).
static bool covered(memory_table& t, std::uintptr_t p, std::size_t n, access_need need, device_set devices) {
  std::uintptr_t at = p;
  const std::uintptr_t end = p + n;
  while (at < end) {
    region* r = t.find(at);
    if (r == nullptr || !region_allows(*r, need, devices)) return false;
    at = r->end();
  }
  return true;
}

CUresult check_device_range(std::uintptr_t p, std::size_t n, access_need need, device_set devices) {
  if (n == 0) return CUDA_SUCCESS;
  if (p == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  return covered(t, p, n, need, devices) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult check_any_range(std::uintptr_t p, std::size_t n, access_need need, device_set devices) {
  if (n == 0) return CUDA_SUCCESS;
  if (p == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  const bool known = t.find(p) != nullptr || t.find_reservation(p) != nullptr;
  if (!known) return CUDA_SUCCESS;  // pageable host memory: the caller's responsibility, as on a GPU
  return covered(t, p, n, need, devices) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

device_set devices_of(std::uintptr_t p, std::size_t n) {
  if (n == 0 || p + n < p) return 0;
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  device_set out = 0;
  for (std::uintptr_t at = p; at < p + n;) {
    region* r = t.find(at);
    if (r == nullptr) break;
    if (r->is_device() && !r->host_located) out |= device_bit(r->device);  // host-located: on no device
    at = r->end();
  }
  return out;
}

bool is_page_locked(std::uintptr_t p, std::size_t n) {
  auto& t = memory();
  std::shared_lock lock(t.mutex);
  region* r = t.find(p);
  return r != nullptr && (r->kind == region_kind::host_pinned || r->kind == region_kind::host_registered) &&
         p + n <= r->end();
}

}  // namespace vmmckpt::emu
