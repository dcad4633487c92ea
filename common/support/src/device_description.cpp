#include "vmmckpt/support/device_description.hpp"

#include <nlohmann/json.hpp>

#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt {

nlohmann::ordered_json encode_devices(const std::vector<device_description>& devices) {
  return json_fields::array_of_each(devices, [](const device_description& d) {
    return nlohmann::ordered_json{
        {"ordinal", d.ordinal}, {"name", d.name}, {"uuid", d.uuid}, {"cc_major", d.cc_major}, {"cc_minor", d.cc_minor}};
  });
}

std::vector<device_description> decode_devices(const nlohmann::json& root) {
  using namespace json_fields;
  std::vector<device_description> out;
  for_each_object(root, "", "devices", [&](const json& d, const std::string& p) {
    out.push_back({int_of(d, p, "ordinal"), string_of(d, p, "name"), string_of(d, p, "uuid"), int_of(d, p, "cc_major"),
                   int_of(d, p, "cc_minor")});
  });
  return out;
}

}  // namespace vmmckpt
