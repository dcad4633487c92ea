// A device UUID as text, the way nvidia-smi shows it: the form images record and tools match on.
#pragma once

#include <cstdio>
#include <string>

namespace vmmckpt {

inline std::string uuid_text(const char (&bytes)[16]) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes);
  char text[64];
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return text;
}

}  // namespace vmmckpt
