// One GPU as the program saw it: what the control channel's replies carry (control_messages) and what an
// image's manifest records (image.hpp), the same struct for both.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace vmmckpt {

struct device_description {
  int ordinal = 0;
  std::string name;  // empty when the driver did not say
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-..." as nvidia-smi writes it (uuid_text.hpp); empty when unknown
  int cc_major = 0, cc_minor = 0;
  friend bool operator==(const device_description&, const device_description&) = default;
};

// The "devices" array both write, in a stable field order.
nlohmann::ordered_json encode_devices(const std::vector<device_description>& devices);

// `root`'s "devices" array, read strictly (json_fields): every field named and typed, or a
// json_fields::decode_error naming it ("devices[1].uuid: ...").
std::vector<device_description> decode_devices(const nlohmann::json& root);

}  // namespace vmmckpt
