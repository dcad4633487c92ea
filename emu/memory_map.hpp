// The emulator's table of address ranges it knows about: native device allocations, pinned and
// registered host memory, VMM reservations and VMM mappings. Copies validate pointers against it.
#pragma once

#include "config.hpp"
#include "emu_api.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <shared_mutex>

namespace vmmckpt::emu {

enum class region_kind { native_device, host_pinned, host_registered, vmm_mapping };

struct region {
  std::uintptr_t base = 0;
  std::size_t size = 0;    // bytes the caller asked for (native) or mapped (vmm)
  std::size_t mapped = 0;  // bytes actually mmap'd (native/pinned: page-rounded)
  region_kind kind = region_kind::native_device;
  int device = 0;
  unsigned host_flags = 0;  // cuMemHostAlloc / cuMemHostRegister flags
  // VMM mappings only.
  std::uint64_t handle = 0;
  std::size_t offset = 0;
  std::array<unsigned char, max_devices> access{};  // CUmemAccess_flags per device
  unsigned char host_access = 0;                    // CUmemAccess_flags of the host (HOST_NUMA) location
  bool host_located = false;                        // a handle created on a host location: host memory
  std::uint64_t buffer_id = 0;

  std::uintptr_t end() const { return base + size; }
  bool is_device() const { return kind == region_kind::native_device || kind == region_kind::vmm_mapping; }
};

struct reservation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
};

// One lock for all of it: VMM calls are rare and short, copies take it shared.
struct memory_table {
  std::shared_mutex mutex;
  std::map<std::uintptr_t, region> regions;            // non-overlapping, keyed by base
  std::map<std::uintptr_t, reservation> reservations;  // keyed by base
  std::uint64_t next_buffer_id = 1;

  // Caller holds the lock. The region containing `p`, or nullptr.
  region* find(std::uintptr_t p);
  reservation* find_reservation(std::uintptr_t p);
  // True when [p, p+n) overlaps any region.
  bool overlaps(std::uintptr_t p, std::size_t n);
};

memory_table& memory();

// How a pointer of a copy may be used.
enum class access_need { read, write };

// Devices as a bit set (bit d: device d).
using device_set = std::uint32_t;
inline constexpr device_set device_bit(int device) { return device >= 0 ? device_set{1} << device : 0; }

// CUDA_SUCCESS when [p, p+n) is device-accessible memory (native, accessible VMM mappings, or
// pinned/registered host memory, which unified addressing lets the device use). VMM mappings must
// also give access to every device in `devices` (those a copy involves: the real driver stages no
// VMM copy through the host, so a device without access gets CUDA_ERROR_INVALID_VALUE); native
// memory is reachable from every device. Takes the lock.
CUresult check_device_range(std::uintptr_t p, std::size_t n, access_need need, device_set devices = 0);
// For cuMemcpy: memory the emulator does not know is pageable host memory, but a pointer into
// a VMM reservation that is not accessibly mapped is an error.
CUresult check_any_range(std::uintptr_t p, std::size_t n, access_need need, device_set devices = 0);
// The devices whose memory (native or VMM) [p, p+n) lies in; none for host memory.
device_set devices_of(std::uintptr_t p, std::size_t n);
// True when the whole range is pinned or registered host memory (async copies stay asynchronous).
bool is_page_locked(std::uintptr_t p, std::size_t n);

inline constexpr std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

}  // namespace vmmckpt::emu
