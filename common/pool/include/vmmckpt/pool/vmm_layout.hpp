// Program-made VMM memory as a dump records it and a restore rebuilds it: reservations, handles (by token),
// mappings and access rights. The registry (vmm_registry.hpp) keeps it live in the shim; the control
// channel and the image carry it (docs/vmm.md, docs/image-format.md).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vmmckpt/pool/pool_layout.hpp"

namespace vmmckpt {

// The driver's granularity for device memory on every GPU so far; placement uses it as a constant so
// that addresses never depend on the GPU model.
inline constexpr std::uint64_t vmm_granularity = large_alignment;

// A handle token: "vmm" in bits 63..40, a counter from 1 in bits 39..0, so the n-th owned cuMemCreate of
// a run gets the same token in every run. The tag is not a canonical user-space pointer, which is what
// real drivers' handle values look like, nor a small integer, which is what the emulator's are.
inline constexpr std::uint64_t vmm_token_tag = 0x766d6dULL << 40;
inline constexpr std::uint64_t vmm_token_counter_mask = (1ULL << 40) - 1;
constexpr bool looks_like_vmm_token(std::uint64_t value) {
  return (value & ~vmm_token_counter_mask) == vmm_token_tag && (value & vmm_token_counter_mask) != 0;
}
// The value the program holds for another process's handle it imported, once the exporter said which it is:
// "vmi" in bits 63..40 and a counter. The driver's handle under it changes when the import is made again (a
// job suspended and resumed, docs/job-checkpoint.md); the program's value does not. Never in images.
inline constexpr std::uint64_t vmm_import_token_tag = 0x766d69ULL << 40;
constexpr bool looks_like_import_token(std::uint64_t value) {
  return (value & ~vmm_token_counter_mask) == vmm_import_token_tag && (value & vmm_token_counter_mask) != 0;
}

// The program's CUmemAllocationProp exactly as it passed it, as bytes so that this header needs no
// cuda.h (the shim checks at compile time that the struct fits).
struct vmm_properties {
  std::array<unsigned char, 64> bytes{};
  bool operator==(const vmm_properties&) const = default;
};

struct vmm_reservation {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;  // as the program asked; placement occupies it rounded up to the granularity
  int device = 0;          // whose window it lies in
  bool operator==(const vmm_reservation&) const = default;
};

struct vmm_handle {
  std::uint64_t token = 0;
  std::uint64_t real = 0;  // the driver's handle; one driver reference held while this record lives (not in images)
  std::uint64_t size = 0;
  int device = 0;
  std::uint64_t flags = 0;  // cuMemCreate's flags
  vmm_properties properties;
  std::uint32_t refs = 0;      // create 1, each retain +1, each release -1
  std::uint32_t mappings = 0;  // mapping records using it; the record goes when both are 0 (not in images)
};

struct vmm_mapping {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t token = 0;
  std::uint64_t offset = 0;  // into the handle's memory
  bool operator==(const vmm_mapping&) const = default;
};

struct vmm_access {
  int location_type = 0;  // CUmemLocationType
  int location_id = 0;
  std::uint64_t flags = 0;  // CUmemAccess_flags
  bool operator==(const vmm_access&) const = default;
};

// Access rights over [addr, addr + size): neighbouring ranges with the same rights are one record.
struct vmm_access_range {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::vector<vmm_access> access;  // one entry per location, ordered by (type, id)
  bool operator==(const vmm_access_range&) const = default;
};

// Another process's handle mapped here (cuMemImportFromShareableHandle, as NCCL's transports import a peer's
// buffers), once the exporter said which of its handles it is: no bytes of it are this process's to save,
// but a restore maps it again from the exporter (docs/vmm.md, "Shared between processes").
struct vmm_import {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t offset = 0;  // into the exporter's handle
  std::int64_t exporter_pid = 0;
  std::uint64_t exporter_start = 0;  // its start time (clock ticks since boot): a reused pid is not it
  std::uint64_t token = 0;           // the handle's token in the exporter
  std::uint64_t handle_size = 0;
  std::string device_uuid;  // the GPU its memory is on; empty for memory on the host
  bool operator==(const vmm_import&) const = default;
};

// Everything owned at one moment: what a dump records and a restore rebuilds. Its bytes are stored
// apart, per mapping, in the image's pools of kind vmm (one per device window).
struct vmm_layout {
  vmm_config windows;                         // device d's window: [windows.device_base(d), + windows.window)
  std::uint64_t next_token = 1;               // the counter the next cuMemCreate takes
  std::vector<vmm_reservation> reservations;  // address order
  std::vector<vmm_handle> handles;            // token order; `real` and `mappings` are 0 here
  std::vector<vmm_mapping> mappings;          // address order
  std::vector<vmm_access_range> access;       // address order; over mappings and imports
  std::vector<vmm_import> imports;            // address order, apart from the mappings
  bool empty() const { return reservations.empty() && handles.empty(); }
  bool operator==(const vmm_layout& o) const;
};

// The window a reservation occupies: its size rounded up to whole granules.
constexpr std::uint64_t vmm_span(std::uint64_t size) { return align_up(size, vmm_granularity); }

// The layout's rules (docs/image-format.md): sorted and disjoint lists, reservations inside their
// device's window, mappings inside reservations and inside their handle, access inside mappings,
// tokens below next_token. An empty string when it obeys them, else the first defect, named by path
// under `path` ("vmm.mappings[3]: ...").
std::string check(const vmm_layout& l, const std::string& path);

// JSON as the image and the control channel write it; decoding is strict (json_fields) and throws
// json_fields::decode_error naming the field.
nlohmann::ordered_json to_json(const vmm_layout& l);
vmm_layout vmm_layout_from_json(const nlohmann::json& j, const std::string& path);

}  // namespace vmmckpt
