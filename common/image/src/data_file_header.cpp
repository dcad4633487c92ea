// The data files of an image: their names and the 64-byte header each begins with (docs/image-format.md).
#include "image_detail.hpp"

namespace vmmckpt::image::detail {

std::string data_file_name(std::uint32_t file) {
  return file == 0 ? std::string(data_name) : "data." + std::to_string(file) + ".bin";
}

namespace {
void put_le(header_bytes& h, std::size_t at, std::uint64_t v, int bytes) { vmmckpt::put_le(h.data() + at, v, bytes); }
std::uint64_t get_le(const header_bytes& h, std::size_t at, int bytes) { return vmmckpt::get_le(h.data() + at, bytes); }
}  // namespace

header_bytes encode_data_header(std::uint64_t payload_bytes, std::uint64_t manifest_checksum, std::uint32_t file,
                                std::uint32_t files) {
  header_bytes h{};
  std::memcpy(h.data(), data_magic.data(), data_magic.size());
  put_le(h, 12, data_version, 4);
  put_le(h, 16, payload_bytes, 8);
  put_le(h, 24, manifest_checksum, 8);
  put_le(h, 32, file, 4);
  put_le(h, 36, files, 4);
  return h;
}

std::uint64_t header_manifest_checksum(const header_bytes& h) { return get_le(h, 24, 8); }

std::string check_data_header(const header_bytes& h, std::uint64_t expected_payload, std::uint32_t format,
                              std::uint32_t file, std::uint32_t files) {
  if (std::memcmp(h.data(), data_magic.data(), data_magic.size()) != 0) return "bad magic (not a vmmckpt data file)";
  const auto version = static_cast<std::uint32_t>(get_le(h, 12, 4));
  if (version > data_version)
    return "format " + std::to_string(version) + " is newer than this tool understands (" +
           std::to_string(data_version) + ")";
  if (version != format)
    return "format " + std::to_string(version) + " does not match the manifest's format " + std::to_string(format);
  const std::uint64_t payload = get_le(h, 16, 8);
  if (payload != expected_payload)
    return "header gives a payload of " + std::to_string(payload) +
           " bytes but the manifest's extents in this file hold " + std::to_string(expected_payload);
  std::size_t reserved_from = 32;
  if (version >= 2) {
    if (get_le(h, 32, 4) != file || get_le(h, 36, 4) != files)
      return "header says it is data file " + std::to_string(get_le(h, 32, 4)) + " of " +
             std::to_string(get_le(h, 36, 4)) + ", expected " + std::to_string(file) + " of " + std::to_string(files);
    reserved_from = 40;
  }
  for (std::size_t i = reserved_from; i < h.size(); ++i)
    if (h[i] != 0) return "reserved header byte " + std::to_string(i) + " is not zero";
  return {};
}

}  // namespace vmmckpt::image::detail
