// The JSON of the IPC imports a dump records, shared by the control channel and the image.
#include "vmmckpt/pool/ipc_imports.hpp"

#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt {

using namespace json_fields;

nlohmann::ordered_json to_json(const std::vector<ipc_import>& imports) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& i : imports) {
    nlohmann::ordered_json j;
    j["exporter_pid"] = i.exporter_pid;
    j["exporter_base"] = hex(i.exporter_base);
    j["size"] = i.size;
    j["addr"] = hex(i.addr);
    j["device_uuid"] = i.device_uuid;
    list.push_back(std::move(j));
  }
  return list;
}

std::vector<ipc_import> ipc_imports_from_json(const json& root) {
  std::vector<ipc_import> out;
  if (optional_field(root, "ipc_imports") == nullptr) return out;
  for_each_object(root, "", "ipc_imports", [&](const json& j, const std::string& p) {
    out.push_back({i64_of(j, p, "exporter_pid"), address_of(j, p, "exporter_base"), u64_of(j, p, "size"),
                   address_of(j, p, "addr"), string_of(j, p, "device_uuid")});
  });
  return out;
}

}  // namespace vmmckpt
