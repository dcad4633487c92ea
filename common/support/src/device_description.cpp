#include "vmmckpt/support/device_description.hpp"

#include <nlohmann/json.hpp>

#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt {

nlohmann::ordered_json encode_devices(const std::vector<device_description>& devices) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& d : devices) {
    nlohmann::ordered_json j;
    j["ordinal"] = d.ordinal;
    j["name"] = d.name;
    j["uuid"] = d.uuid;
    j["cc_major"] = d.cc_major;
    j["cc_minor"] = d.cc_minor;
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<device_description> decode_devices(const nlohmann::json& root) {
  using namespace json_fields;
  const json& devices = array_of(root, "", "devices");
  std::vector<device_description> out;
  out.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const std::string p = index("devices", i);
    const json& d = object_at(devices[i], p);
    device_description dev;
    dev.ordinal = int_of(d, p, "ordinal");
    dev.name = string_of(d, p, "name");
    dev.uuid = string_of(d, p, "uuid");
    dev.cc_major = int_of(d, p, "cc_major");
    dev.cc_minor = int_of(d, p, "cc_minor");
    out.push_back(std::move(dev));
  }
  return out;
}

}  // namespace vmmckpt
