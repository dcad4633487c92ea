// What the shim knows of the VMM memory a program maps itself: its reservations (placed in windows of
// ours), handle tokens, mappings and access rights. Pure bookkeeping, kept apart from CUDA so that it is
// tested without a GPU; shim/src/entry/vmm_entry_points.cpp makes the driver calls (docs/vmm.md).
//
// Not thread-safe: the shim holds one mutex around every call.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "vmmckpt/pool/pool_layout.hpp"
#include "vmmckpt/pool/vmm_layout.hpp"

namespace vmmckpt {

enum class vmm_status {
  ok,
  invalid_value,  // what the driver answers too (not our exact reservation, a double release, a bad alignment)
  out_of_memory,  // no room in the window
  not_found,      // not ours: the caller passes the call through to the driver
};

// VMM memory that passes through, by kind: what a suspend would leave on the GPU.
enum class vmm_not_owned_kind { host, other, imported };
struct vmm_not_owned_bytes {
  std::uint64_t host = 0;      // created on a host location (HOST, HOST_NUMA...): from create to last release
  std::uint64_t other = 0;     // created with any other property we do not own: from create to last release
  std::uint64_t imported = 0;  // imported handles, whose size the importer cannot know: bytes mapped
  // Owned handles mapped nowhere: no address shows their bytes, so no image holds them (they come back
  // zeroed). Filled by the shim from unmapped_handle_bytes().
  std::uint64_t unmapped = 0;
  std::uint64_t total() const { return host + other + imported + unmapped; }
};

class vmm_registry {
 public:
  // Device d's window is [base + d * window, base + (d + 1) * window), for d below `devices`.
  vmm_registry(std::uint64_t base, std::uint64_t window, int devices = max_devices);

  // ---- reservations
  // Places and records a reservation on `device`'s window: the hint when [hint, hint + size) lies free
  // inside a window (any device's; the reservation then belongs to that one) and honours the
  // alignment, else the lowest free address with the alignment (at least the granularity).
  // invalid_value: size 0, an alignment that is not a power of two, a device without a window;
  // out_of_memory: no room.
  vmm_status reserve(int device, std::uint64_t size, std::uint64_t alignment, std::uint64_t hint, std::uint64_t& addr);
  // Whether (addr, size) may be freed: ok for exactly one of our reservations, invalid_value when it
  // touches ours otherwise, not_found when it touches none (not ours: pass it through).
  vmm_status check_free(std::uint64_t addr, std::uint64_t size) const;
  // Forgets a reservation check_free accepted, with the mappings and access inside it (the driver drops
  // them with the range); handles left with neither references nor mappings go, their real handles
  // appended to `release_real` for the caller to release.
  vmm_status free_reservation(std::uint64_t addr, std::uint64_t size, std::vector<std::uint64_t>& release_real);

  // ---- handles
  // Records a handle the driver created for us; returns its token (refs 1), or 0 when the counter is
  // spent. Never throws but for std::bad_alloc.
  std::uint64_t add_handle(std::uint64_t real, std::uint64_t size, int device, std::uint64_t flags,
                           const vmm_properties& properties);
  // A token with at least one reference, or null (unknown values, and tokens released but still
  // mapped, are not live: the driver too refuses a released handle).
  const vmm_handle* live_handle(std::uint64_t token) const;
  // Any record, live or only mapped.
  const vmm_handle* find_handle(std::uint64_t token) const;
  // Swaps the driver handle under a token (a later resume re-creates the memory).
  bool replace_real(std::uint64_t token, std::uint64_t real);
  // One reference less. ok, with the real handle appended to release_real when the record went;
  // invalid_value when the token had no reference left; not_found when it is no token of ours.
  vmm_status release(std::uint64_t token, std::vector<std::uint64_t>& release_real);
  // One reference more on the token mapped at addr (any address inside a mapping); not_found when no
  // mapping of ours lies there.
  vmm_status retain_at(std::uint64_t addr, std::uint64_t& token);

  // ---- mappings
  // Records that the driver mapped `handle` (a live token, or a not-owned handle we count) at
  // [addr, addr + size) from `offset`. not_found: neither (nothing recorded). invalid_value: the range
  // overlaps a recorded mapping.
  vmm_status map(std::uint64_t addr, std::uint64_t size, std::uint64_t offset, std::uint64_t handle);
  // Removes every mapping record [addr, addr + size) touches, keeping the parts outside it (a partial
  // unmap splits a mapping), and the access rights inside it. Handles left with neither references nor
  // mappings go; owned ones' real handles are appended to release_real.
  void unmap(std::uint64_t addr, std::uint64_t size, std::vector<std::uint64_t>& release_real);
  // The owned mapping that contains addr, if any.
  std::optional<vmm_mapping> mapping_at(std::uint64_t addr) const;
  // Every mapping record, owned or not, that lies in [addr, addr + size), as (address, size).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> mapped_in(std::uint64_t addr, std::uint64_t size) const;
  // The reservation that contains addr, if any.
  std::optional<vmm_reservation> reservation_at(std::uint64_t addr) const;

  // ---- access
  // Sets, for each location in `access`, its flags over [addr, addr + size); other locations keep theirs.
  void set_access(std::uint64_t addr, std::uint64_t size, std::span<const vmm_access> access);

  // ---- memory that passes through
  void add_not_owned(std::uint64_t real, vmm_not_owned_kind kind, std::uint64_t size);
  // An imported handle whose exporter said which of its handles it is (`origin`'s exporter, token, size and
  // device; its address fields are unused): its mappings are the layout's imports, and it is not counted
  // as lacking. Returns the value the program is given for it (looks_like_import_token), which stands for the
  // driver's handle from then on. A second import of the same real handle takes one more reference.
  std::uint64_t add_import(std::uint64_t real, const vmm_import& origin);
  // The driver's handle under a value the program holds: the real handle of an import token (0 while the
  // import is given back), the value itself for any other.
  std::uint64_t driver_value(std::uint64_t value) const;
  // Whether an import token names an identified import recorded here.
  bool knows_import(std::uint64_t token) const;
  // The import token over a driver handle, when that handle is an identified import's.
  std::optional<std::uint64_t> import_token_of(std::uint64_t real) const;
  // Identified imports, for a job's suspend and resume: each one's token, driver handle (0 once given back),
  // the program's references, where it comes from and where it is mapped.
  struct held_import {
    std::uint64_t token = 0, real = 0;
    std::uint32_t refs = 0;
    vmm_import origin;
    std::vector<vmm_mapping> mappings;  // token: the import token; offset: into the exporter's handle
  };
  std::vector<held_import> identified_imports() const;
  // A job's suspend gives an import's driver handle back (0), its resume sets the new one; an exporter_start
  // other than 0 is the exporter's start time now (a job restored by CRIU started its processes anew).
  void set_import_real(std::uint64_t token, std::uint64_t real, std::uint64_t exporter_start = 0);
  // The access rights recorded over [addr, addr + size), clipped to it.
  std::vector<vmm_access_range> access_over(std::uint64_t addr, std::uint64_t size) const;
  // The origins of identified imports whose last reference and mapping went since the last call: the
  // exporter is told that this process maps them no more.
  std::vector<vmm_import> take_dropped_imports();
  // A retain or release the driver answered for a not-owned handle; unknown values are ignored.
  void retain_not_owned(std::uint64_t real);
  void release_not_owned(std::uint64_t real);
  vmm_not_owned_bytes not_owned_bytes() const;

  // ---- enumeration, for a dump or a suspend
  std::vector<vmm_reservation> reservations() const;  // address order
  std::vector<vmm_handle> handles() const;            // token order
  std::size_t handle_count() const { return handles_.size(); }
  std::vector<vmm_mapping> mappings() const;     // owned mappings, address order
  std::vector<vmm_access_range> access() const;  // address order

  // ---- a dump, a suspend, a restore
  // Everything owned now, as an image records it (real handles and mapping counts left out; access rights
  // over owned mappings only).
  vmm_layout layout() const;
  // Suspend: every owned handle's real handle, for the caller to unmap and release; the records keep
  // their tokens, mappings and access with `real` 0 until replace_real() gives them new ones. Handles for
  // which keep(handle) is true stay as they are (host memory, which a suspend does not give back).
  template <class Keep>
  std::vector<std::pair<std::uint64_t, std::uint64_t>> take_real(Keep&& keep) {  // (token, real)
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    for (auto& [token, h] : handles_) {
      if (h.real == 0 || keep(h)) continue;
      out.emplace_back(token, h.real);
      h.real = 0;
    }
    return out;
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> take_real() {
    return take_real([](const vmm_handle&) { return false; });
  }
  // A new process restoring an image: the registry, still empty, takes the layout as its own (the
  // caller has made the driver's reservations; real handles come with replace_real()). False when the
  // registry is not empty or the layout's windows are not this registry's.
  bool load(const vmm_layout& l);
  // Bytes of owned handles that no mapping shows (handles mapped nowhere, or only in part): a dump cannot
  // read them (they come back zeroed).
  std::uint64_t unmapped_handle_bytes() const;

  std::uint64_t window_base(int device) const { return base_ + static_cast<std::uint64_t>(device) * window_; }
  std::uint64_t window_size() const { return window_; }

 private:
  struct mapping_record {
    std::uint64_t size;
    std::uint64_t handle;  // token, or the real value of a not-owned handle
    std::uint64_t offset;
    bool owned;
  };
  struct not_owned_record {
    vmm_not_owned_kind kind;
    std::uint64_t size;
    std::uint32_t refs;
    std::uint32_t mappings;
    std::optional<vmm_import> origin;  // an identified import, recorded under its import token
    std::uint64_t real = 0;            // the driver's handle: the key itself, but for an identified import
  };
  struct access_record {
    std::uint64_t end;
    std::vector<vmm_access> access;
  };

  bool range_free(std::uint64_t addr, std::uint64_t span) const;
  int window_of(std::uint64_t addr, std::uint64_t span) const;  // -1: not wholly inside one window
  void adjust_mappings(const mapping_record& m, int delta);
  void drop_if_unused(std::uint64_t handle, bool owned, std::vector<std::uint64_t>& release_real);
  void split_access_at(std::uint64_t addr);
  void erase_access(std::uint64_t addr, std::uint64_t end);
  void coalesce_access(std::uint64_t from, std::uint64_t to);

  std::uint64_t base_;
  std::uint64_t window_;
  int devices_;
  std::uint64_t next_counter_ = 1;
  std::uint64_t next_import_counter_ = 1;
  std::map<std::uint64_t, vmm_reservation> reservations_;  // by address
  std::map<std::uint64_t, vmm_handle> handles_;            // by token
  std::map<std::uint64_t, mapping_record> mappings_;       // by address; owned and counted not-owned
  std::map<std::uint64_t, not_owned_record> not_owned_;    // by real handle
  std::map<std::uint64_t, access_record> access_;          // by address; disjoint
  std::vector<vmm_import> dropped_imports_;
};

}  // namespace vmmckpt
