// process.json of a whole-process image: written, read with every field checked, and both parts verified.
#include "vmmckpt/ckpt/process_image.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "vmmckpt/hex_text.hpp"
#include "vmmckpt/image.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const fs::path& dir, const std::string& what) {
  throw image::image_error((dir / process_manifest_name).string() + ": " + what);
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    throw image::image_error(path.string() + ": fsync failed: " + std::strerror(e));
  }
  ::close(fd);
}

// XXH3-64 of a file's bytes, read in 1 MiB pieces.
std::uint64_t file_checksum(const fs::path& path, std::uint64_t& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw image::image_error(path.string() + ": cannot be read");
  image::streaming_checksum sum;
  std::vector<char> buffer(1 << 20);
  bytes = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    sum.update(buffer.data(), n);
    bytes += n;
  }
  return sum.value();
}

bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

template <class T>
T field(const nlohmann::json& j, const char* key, const fs::path& dir, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) fail(dir, where + "missing field '" + key + "'");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    fail(dir, where + "field '" + key + "' has the wrong type");
  }
}

}  // namespace

bool is_process_image(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / process_manifest_name, ec);
}

process_image read_process_image(const fs::path& dir) {
  std::ifstream in(dir / process_manifest_name);
  if (!in) fail(dir, "cannot be read");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(dir, std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) fail(dir, "not a JSON object");
  if (field<std::string>(j, "format", dir, "") != process_format_name) fail(dir, "not a vmmckpt whole-process image");
  if (const int v = field<int>(j, "version", dir, ""); v != process_format_version)
    fail(dir, "version " + std::to_string(v) + ", this cuda-ckpt reads version " + std::to_string(process_format_version));
  process_image p;
  p.tool_version = field<std::string>(j, "tool_version", dir, "");
  p.created = field<std::string>(j, "created", dir, "");
  p.host = field<std::string>(j, "host", dir, "");
  p.root_pid = field<pid_t>(j, "root_pid", dir, "");
  p.criu_version = field<std::string>(j, "criu_version", dir, "");
  p.gpu_bytes = field<std::uint64_t>(j, "gpu_bytes", dir, "");
  p.stopped_seconds = field<double>(j, "stopped_seconds", dir, "");
  p.left_running = field<bool>(j, "left_running", dir, "");
  if (p.root_pid <= 0) fail(dir, "root_pid must be positive");
  if (j.contains("parent")) p.parent = field<std::string>(j, "parent", dir, "");  // optional: incremental images
  std::set<pid_t> pids;
  const auto processes = field<nlohmann::json>(j, "processes", dir, "");
  if (!processes.is_array() || processes.empty()) fail(dir, "processes must be a non-empty array");
  for (std::size_t i = 0; i < processes.size(); ++i) {
    const std::string where = "processes[" + std::to_string(i) + "]: ";
    if (!processes[i].is_object()) fail(dir, where + "not an object");
    process_image::member m;
    m.pid = field<pid_t>(processes[i], "pid", dir, where);
    m.parent = field<pid_t>(processes[i], "parent", dir, where);
    m.command = field<std::vector<std::string>>(processes[i], "command", dir, where);
    m.image_id = field<std::string>(processes[i], "image_id", dir, where);
    m.driver_checkpointed = field<bool>(processes[i], "driver_checkpointed", dir, where);
    if (m.pid <= 0 || !pids.insert(m.pid).second) fail(dir, where + "pid missing, not positive or repeated");
    p.processes.push_back(std::move(m));
  }
  const auto files = field<nlohmann::json>(j, "criu_files", dir, "");
  if (!files.is_array() || files.empty()) fail(dir, "criu_files must be a non-empty array");
  std::set<std::string> names;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string where = "criu_files[" + std::to_string(i) + "]: ";
    if (!files[i].is_object()) fail(dir, where + "not an object");
    process_image::file f;
    f.name = field<std::string>(files[i], "name", dir, where);
    f.bytes = field<std::uint64_t>(files[i], "bytes", dir, where);
    const auto checksum = field<std::string>(files[i], "checksum", dir, where);
    if (!plain_name(f.name) || !names.insert(f.name).second) fail(dir, where + "name '" + f.name + "' is not a plain, unique file name");
    if (checksum.size() != 16 || !parse_hex_digits(checksum, f.checksum)) fail(dir, where + "checksum is not 16 hex digits");
    p.criu_files.push_back(std::move(f));
  }
  return p;
}

void verify_process_image(const fs::path& dir, const process_image& p, bool data) {
  const fs::path criu = dir / criu_dir_name;
  std::set<std::string> listed;
  for (const auto& f : p.criu_files) {
    listed.insert(f.name);
    std::error_code ec;
    if (!fs::is_regular_file(criu / f.name, ec)) throw image::image_error((criu / f.name).string() + ": missing (the CPU part is incomplete)");
    std::uint64_t bytes = 0;
    const std::uint64_t sum = file_checksum(criu / f.name, bytes);
    if (bytes != f.bytes)
      throw image::image_error((criu / f.name).string() + ": " + std::to_string(bytes) + " bytes, process.json says " +
                               std::to_string(f.bytes) + " (the CPU part is damaged)");
    if (sum != f.checksum)
      throw image::image_error((criu / f.name).string() + ": checksum mismatch (process.json " + hex16(f.checksum) +
                               ", file " + hex16(sum) + "): the CPU part is damaged");
  }
  for (const auto& entry : fs::directory_iterator(criu))
    if (entry.is_regular_file() && !listed.count(entry.path().filename().string()))
      throw image::image_error(entry.path().string() + ": not in process.json (the CPU part was changed)");
  for (const auto& m : p.processes) {
    const fs::path gpu = p.gpu_image(dir, m.pid);
    const auto reader = image::reader::open(gpu);
    if (reader.info().image_id != m.image_id)
      throw image::image_error(gpu.string() + ": image_id " + reader.info().image_id + ", process.json says " + m.image_id);
    if (data)
      reader.verify_data();
    else
      reader.verify_manifest();
  }
}

std::vector<process_image::file> describe_criu_files(const fs::path& dir) {
  std::vector<process_image::file> files;
  for (const auto& entry : fs::directory_iterator(dir / criu_dir_name)) {
    if (!entry.is_regular_file()) continue;
    process_image::file f;
    f.name = entry.path().filename().string();
    f.checksum = file_checksum(entry.path(), f.bytes);
    fsync_path(entry.path(), false);
    files.push_back(std::move(f));
  }
  fsync_path(dir / criu_dir_name, true);
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return files;
}

void write_process_manifest(const fs::path& dir, const process_image& p) {
  nlohmann::json j = {{"format", process_format_name}, {"version", process_format_version},
                      {"tool_version", p.tool_version}, {"created", p.created},
                      {"host", p.host}, {"root_pid", p.root_pid},
                      {"criu_version", p.criu_version}, {"gpu_bytes", p.gpu_bytes},
                      {"stopped_seconds", p.stopped_seconds}, {"left_running", p.left_running}};
  if (!p.parent.empty()) j["parent"] = p.parent;
  j["processes"] = nlohmann::json::array();
  for (const auto& m : p.processes)
    j["processes"].push_back({{"pid", m.pid}, {"parent", m.parent}, {"command", m.command},
                              {"image_id", m.image_id}, {"driver_checkpointed", m.driver_checkpointed}});
  j["criu_files"] = nlohmann::json::array();
  for (const auto& f : p.criu_files)
    j["criu_files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"checksum", hex16(f.checksum)}});
  const fs::path path = dir / process_manifest_name;
  {
    std::ofstream out(path, std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out.flush()) throw image::image_error(path.string() + ": cannot be written");
  }
  fsync_path(path, false);
  fsync_path(dir, true);
}

}  // namespace vmmckpt::ckpt
