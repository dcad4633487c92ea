// libFuzzer target: the input is manifest JSON handed to image::from_json, validate and to_json (round trip).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "vmmckpt/image/image.hpp"

namespace {

namespace img = vmmckpt::image;

// Refusals are printed to terminals (cuda-ckpt verify): a message must not carry raw bytes of the
// hostile file, such as escape sequences or broken UTF-8. The paths in them are ours, hence ASCII.
void check_message(const img::image_error& e) {
  for (const char* c = e.what(); *c != '\0'; ++c) {
    const auto b = static_cast<unsigned char>(*c);
    if (b < 0x20 || b >= 0x7f) {
      std::fprintf(stderr, "%s: refusal message holds byte 0x%02x at %td\n", "manifest_fuzzer", b, c - e.what());
      std::abort();
    }
  }
}

[[noreturn]] void broken(const char* what, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "manifest_fuzzer: %s\n--- first:\n%s\n--- second:\n%s\n", what, a.c_str(), b.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  img::manifest m;
  try {
    m = img::from_json(text);
  } catch (const img::image_error& e) {
    check_message(e);
    return 0;  // the expected refusal; any other exception escaping is reported as a crash
  }

  bool valid = true;
  try {
    img::validate(m);
  } catch (const img::image_error&) {
    valid = false;
  }

  // Whatever decodes must encode and decode to the same manifest, and encode to the same bytes again
  // (the image format promises it; inspect --json relies on it). Validity must survive the trip too.
  const std::string once = img::to_json(m);
  img::manifest again;
  try {
    again = img::from_json(once);
  } catch (const img::image_error& e) {
    broken("to_json wrote what from_json refuses", e.what(), once);
  }
  if (!(again == m)) broken("decoding the re-encoded manifest gave a different manifest", text, once);
  const std::string twice = img::to_json(again);
  if (twice != once) broken("encoding is not stable", once, twice);
  if (valid) {
    try {
      img::validate(again);
    } catch (const img::image_error& e) {
      broken("a valid manifest became invalid in the round trip", e.what(), once);
    }
  }
  return 0;
}
