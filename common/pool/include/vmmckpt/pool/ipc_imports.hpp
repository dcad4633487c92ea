// Other processes' memory that a program maps through legacy CUDA IPC (docs/ipc.md), as a dump's reply and
// its image record it: the exporter's allocation and where the program maps it, never its bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vmmckpt {

struct ipc_import {
  std::int64_t exporter_pid = 0;
  std::uint64_t exporter_base = 0;  // the allocation's address in the exporter
  std::uint64_t size = 0;
  std::uint64_t addr = 0;   // where the program maps that base
  std::string device_uuid;  // the exporter's GPU; empty when unknown
  friend bool operator==(const ipc_import&, const ipc_import&) = default;
};

// The list's JSON, the same in the control channel's dump_begin reply and in an image's manifest
// (`ipc_imports`). Reading is strict (json_fields) and throws json_fields::decode_error naming `path`.
nlohmann::ordered_json to_json(const std::vector<ipc_import>& imports);
// The list at root["ipc_imports"]; none when the field is absent (an older writer's).
std::vector<ipc_import> ipc_imports_from_json(const nlohmann::json& root);

}  // namespace vmmckpt
