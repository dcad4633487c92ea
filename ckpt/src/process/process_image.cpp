// process.json of a whole-process image: written, read with every field checked, and both parts verified. The
// reader is as strict as the GPU-image reader: no symbolic link or special file anywhere, sizes checked before
// anything is read, numbers that do not fit refused.
#include "vmmckpt/ckpt/process_image.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "base/image_files.hpp"
#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/protocol/suspend_claim.hpp"
#include "vmmckpt/support/hex_text.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::ckpt {
namespace fs = std::filesystem;
namespace jf = json_fields;
using namespace image_files;
namespace {

// XXH3-64 of exactly `bytes` bytes of an open file, read in 1 MiB pieces.
std::uint64_t checksum_of(int fd, std::uint64_t bytes, const std::string& path) {
  image::streaming_checksum sum;
  std::vector<char> buffer(1 << 20);
  for (std::uint64_t at = 0; at < bytes;) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), bytes - at));
    const ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path + ": read failed: " + errno_text(errno));
    if (n == 0) fail(path + ": shorter than its size (changed while read)");
    sum.update(buffer.data(), static_cast<std::size_t>(n));
    at += static_cast<std::uint64_t>(n);
  }
  return sum.value();
}

// Walks the tree under dir_fd: every entry's lstat to `visit`, directories entered (never a link).
void walk(int dir_fd, const fs::path& path, int depth,
          const std::function<void(const fs::path&, const struct stat&)>& visit) {
  if (depth > max_depth) fail(path.string() + ": directories nested deeper than an image's");
  for (const auto& name : names_in(dir_fd, path)) {
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      fail((path / name).string() + ": cannot stat: " + errno_text(errno));
    visit(path / name, st);
    if (S_ISDIR(st.st_mode)) {
      fd_guard inner(open_inner_dir(dir_fd, name, path / name));
      walk(inner.fd, path / name, depth + 1, visit);
    }
  }
}

// A whole number in [lowest, pid_limit]: a pid as process.json may hold it.
pid_t pid_at(const jf::json& v, const std::string& path, std::int64_t lowest) {
  const std::int64_t x = jf::i64_at(v, path);
  if (x < lowest || x > pid_limit)
    fail(path + ": " + std::to_string(x) + " is no pid (" + std::to_string(lowest) + " to " +
         std::to_string(pid_limit) + ")");
  return static_cast<pid_t>(x);
}

process_image::member decode_member(const jf::json& j, const std::string& path, int version) {
  jf::object_at(j, path);
  process_image::member m;
  m.pid = pid_at(jf::field(j, path, "pid"), jf::join(path, "pid"), 1);
  m.parent = pid_at(jf::field(j, path, "parent"), jf::join(path, "parent"), 0);
  const auto& command = jf::array_of(j, path, "command");
  for (std::size_t i = 0; i < command.size(); ++i)
    m.command.push_back(jf::string_at(command[i], jf::index(jf::join(path, "command"), i)));
  m.image_id = jf::string_of(j, path, "image_id");
  if (m.image_id.empty()) fail(jf::join(path, "image_id") + ": empty");
  m.driver_checkpointed = jf::bool_of(j, path, "driver_checkpointed");
  if (const auto* pre = jf::optional_field(j, "pre_copy_image_id")) {
    if (version < process_format_version_pre_copy)
      fail(jf::join(path, "pre_copy_image_id") + ": not in a version 1 image");
    m.pre_copy_image_id = jf::string_at(*pre, jf::join(path, "pre_copy_image_id"));
    if (m.pre_copy_image_id.empty()) fail(jf::join(path, "pre_copy_image_id") + ": empty");
  }
  return m;
}

process_image::file decode_file(const jf::json& j, const std::string& path) {
  jf::object_at(j, path);
  process_image::file f;
  f.name = jf::string_of(j, path, "name");
  if (!plain_name(f.name))
    fail(jf::join(path, "name") + ": \"" + jf::printable(f.name) + "\" is not a plain file name");
  f.bytes = jf::u64_of(j, path, "bytes");
  f.checksum = jf::hex16_at(jf::field(j, path, "checksum"), jf::join(path, "checksum"));
  return f;
}

// Everything but the CRIU files, which an intent record (written before CRIU ran) lacks.
process_image decode_description(const jf::json& j) {
  jf::object_at(j, "");
  process_image p;
  if (jf::string_of(j, "", "format") != process_format_name) fail("format: not a vmmckpt whole-process image");
  const int version = jf::int_of(j, "", "version");
  if (version < process_format_version_plain || version > process_format_version)
    fail("version " + std::to_string(version) + ": this cuda-ckpt reads versions " +
         std::to_string(process_format_version_plain) + " to " + std::to_string(process_format_version));
  p.tool_version = jf::string_of(j, "", "tool_version");
  p.created = jf::string_of(j, "", "created");
  p.host = jf::string_of(j, "", "host");
  p.root_pid = pid_at(jf::field(j, "", "root_pid"), "root_pid", 1);
  p.criu_version = jf::string_of(j, "", "criu_version");
  p.gpu_bytes = jf::u64_of(j, "", "gpu_bytes");
  p.stopped_seconds = jf::number_of(j, "", "stopped_seconds");
  if (p.stopped_seconds < 0) fail("stopped_seconds: negative");
  p.left_running = jf::bool_of(j, "", "left_running");
  if (const auto* parent = jf::optional_field(j, "parent")) {
    p.parent = jf::string_at(*parent, "parent");
    if (p.parent.empty() || p.parent.find('\0') != std::string::npos) fail("parent: not a path");
  }
  if (const auto* job = jf::optional_field(j, "job")) {
    if (version < process_format_version) fail("job: not in a version " + std::to_string(version) + " image");
    p.job = jf::bool_at(*job, "job");
  }
  if (const auto* only = jf::optional_field(j, "driver_only")) {
    if (version < process_format_version) fail("driver_only: not in a version " + std::to_string(version) + " image");
    const auto& list = jf::array_at(*only, "driver_only");
    if (list.size() > max_processes) fail("driver_only: more than " + std::to_string(max_processes));
    for (std::size_t i = 0; i < list.size(); ++i)
      p.driver_only.push_back(pid_at(list[i], jf::index("driver_only", i), 1));
  }
  const auto& processes = jf::array_of(j, "", "processes");
  if (processes.empty() || processes.size() > max_processes)
    fail("processes: 1 to " + std::to_string(max_processes) + " expected, not " + std::to_string(processes.size()));
  std::set<pid_t> pids;
  for (std::size_t i = 0; i < processes.size(); ++i) {
    p.processes.push_back(decode_member(processes[i], jf::index("processes", i), version));
    if (!pids.insert(p.processes.back().pid).second)
      fail(jf::index("processes", i) + ".pid: " + std::to_string(p.processes.back().pid) + " repeated");
  }
  for (std::size_t i = 0; i < p.driver_only.size(); ++i)
    if (!pids.insert(p.driver_only[i]).second)
      fail(jf::index("driver_only", i) + ": " + std::to_string(p.driver_only[i]) + " repeated");
  return p;
}

jf::json parse_text(const std::string& text) {
  try {
    return jf::parse_limited(text, 8);
  } catch (const jf::decode_error& e) {
    fail(e.what());
  }
}

}  // namespace

bool is_process_image(const fs::path& dir) {
  struct stat st {};
  return ::lstat((dir / process_manifest_name).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_process_image_part(const fs::path& image) {
  if (image.empty()) return false;
  fs::path at = fs::absolute(image).lexically_normal();
  if (!at.has_filename()) at = at.parent_path();
  return at.parent_path().filename() == gpu_dir_name && is_process_image(at.parent_path().parent_path());
}

process_image parse_process_manifest(const std::string& text, const std::string& where) {
  try {
    const jf::json j = parse_text(text);
    process_image p = decode_description(j);
    const auto& files = jf::array_of(j, "", "criu_files");
    if (files.empty() || files.size() > max_criu_files)
      fail("criu_files: 1 to " + std::to_string(max_criu_files) + " expected, not " + std::to_string(files.size()));
    std::set<std::string> names;
    for (std::size_t i = 0; i < files.size(); ++i) {
      p.criu_files.push_back(decode_file(files[i], jf::index("criu_files", i)));
      if (!names.insert(p.criu_files.back().name).second)
        fail(jf::index("criu_files", i) + ".name: \"" + jf::printable(p.criu_files.back().name) + "\" repeated");
    }
    return p;
  } catch (const jf::decode_error& e) {
    fail(where + ": " + e.what());
  } catch (const image::image_error& e) {
    fail(where + ": " + e.what());
  }
}

process_image parse_process_intent(const std::string& text, const std::string& where) {
  try {
    return decode_description(parse_text(text));
  } catch (const jf::decode_error& e) {
    fail(where + ": " + e.what());
  } catch (const image::image_error& e) {
    fail(where + ": " + e.what());
  }
}

process_image read_process_image(const fs::path& dir) {
  fd_guard dir_fd(open_image_dir(dir));
  const fs::path path = dir / process_manifest_name;
  return parse_process_manifest(read_small_file(dir_fd.fd, process_manifest_name, path, max_process_manifest_bytes),
                                path.string());
}

process_image read_process_intent(const fs::path& dir) {
  fd_guard dir_fd(open_image_dir(dir));
  const fs::path path = dir / process_intent_name;
  return parse_process_intent(read_small_file(dir_fd.fd, process_intent_name, path, max_process_manifest_bytes),
                              path.string());
}

void for_each_entry(const fs::path& dir, const std::function<void(const fs::path&, const struct stat&)>& visit) {
  fd_guard dir_fd(open_image_dir(dir));
  struct stat st {};
  if (::fstat(dir_fd.fd, &st) != 0) fail(dir.string() + ": cannot stat: " + errno_text(errno));
  visit(dir, st);
  walk(dir_fd.fd, dir, 0, visit);
}

void check_process_layout(const fs::path& dir, const process_image& p) {
  // Nothing but directories and regular files, anywhere: a link could point a reader at /proc/kmsg or
  // at another user's file, a FIFO would block it.
  for_each_entry(dir, [](const fs::path& path, const struct stat& st) {
    if (S_ISLNK(st.st_mode)) fail(path.string() + ": a symbolic link in the image (refused)");
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) fail(path.string() + ": a special file in the image (refused)");
  });
  fd_guard top(open_image_dir(dir));
  fd_guard gpu(open_inner_dir(top.fd, gpu_dir_name, dir / gpu_dir_name));
  std::set<std::string> parts;
  for (const auto& m : p.processes) {
    parts.insert(std::to_string(m.pid));
    if (!m.pre_copy_image_id.empty()) parts.insert(std::to_string(m.pid) + pre_copy_suffix);
  }
  // A job's suspend leaves its description and its accepted claim beside the parts (regular files: checked above).
  const std::set<std::string> job_files = {job_manifest_name, suspend_claim::job_accepted};
  for (const auto& name : names_in(gpu.fd, dir / gpu_dir_name))
    if (parts.count(name) == 0 && !(p.job && job_files.count(name) == 1))
      fail((dir / gpu_dir_name / name).string() + ": not a GPU part process.json names");
  for (const auto& name : parts) {
    fd_guard part(open_inner_dir(gpu.fd, name, dir / gpu_dir_name / name));  // there, a directory, no link
  }
}

void verify_criu_files(const fs::path& dir, const process_image& p, bool checksums) {
  const fs::path criu = dir / criu_dir_name;
  fd_guard top(open_image_dir(dir));
  fd_guard criu_fd(open_inner_dir(top.fd, criu_dir_name, criu));
  std::set<std::string> listed;
  for (const auto& f : p.criu_files) {
    listed.insert(f.name);
    const std::string path = (criu / f.name).string();
    struct stat st {};
    int fd = -1;
    try {
      fd = image::open_regular_file(criu_fd.fd, f.name, path, st);
    } catch (const image::image_error& e) {
      if (std::string(e.what()).find("missing") != std::string::npos)
        fail(path + ": missing (the CPU part is incomplete)");
      throw;
    }
    fd_guard file(fd);
    // The size first: a sparse file of a terabyte is refused, not read.
    if (static_cast<std::uint64_t>(st.st_size) != f.bytes)
      fail(path + ": " + std::to_string(st.st_size) + " bytes, process.json says " + std::to_string(f.bytes) +
           " (the CPU part is damaged)");
    if (!checksums) continue;
    if (const std::uint64_t sum = checksum_of(file.fd, f.bytes, path); sum != f.checksum)
      fail(path + ": checksum mismatch (process.json " + hex16(f.checksum) + ", file " + hex16(sum) +
           "): the CPU part is damaged");
  }
  for (const auto& name : names_in(criu_fd.fd, criu))
    if (listed.count(name) == 0) fail((criu / name).string() + ": not in process.json (the CPU part was changed)");
}

// A process CRIU found stopped by a signal comes back stopped, and one under the shim would never load its GPU
// memory: the restore would wait for good. Such an image (from a cuda-ckpt that dumped a stopped program) is
// refused, named, before anything starts.
namespace {
void refuse_stopped_tasks(const fs::path& dir, const process_image& p) {
  std::vector<pid_t> pids = p.driver_only;
  pids.push_back(p.root_pid);
  for (const auto& m : p.processes) pids.push_back(m.pid);
  const auto stopped = criu_stopped_tasks(dir / criu_dir_name, pids);
  if (stopped.empty()) return;
  const std::string pid = std::to_string(stopped.front());
  fail((dir / criu_dir_name / ("core-" + pid + ".img")).string() + ": process " + pid +
       " was stopped by a signal (SIGSTOP, Ctrl-Z or a job scheduler's suspend) when it was dumped; restored, it "
       "would stay stopped and never load its GPU memory, so this image cannot be restored: dump the program again "
       "while it runs");
}
}  // namespace

void verify_process_image(const fs::path& dir, const process_image& p, bool data) {
  check_process_layout(dir, p);
  verify_criu_files(dir, p, true);
  refuse_stopped_tasks(dir, p);
  auto check_part = [&](const fs::path& gpu, const std::string& image_id) {
    const auto reader = image::reader::open(gpu);
    if (reader.info().image_id != image_id)
      fail(gpu.string() + ": image_id " + jf::printable(reader.info().image_id) + ", process.json says " +
           jf::printable(image_id));
    if (data)
      reader.verify_data();
    else
      reader.verify_manifest();
  };
  for (const auto& m : p.processes) {
    // The pre-copied part first: the part that names it as its parent is read through it.
    if (!m.pre_copy_image_id.empty()) check_part(p.pre_copy_image(dir, m.pid), m.pre_copy_image_id);
    check_part(p.gpu_image(dir, m.pid), m.image_id);
  }
}

std::vector<process_image::file> describe_criu_files(const fs::path& dir) {
  const fs::path criu = dir / criu_dir_name;
  fd_guard top(open_image_dir(dir));
  fd_guard criu_fd(open_inner_dir(top.fd, criu_dir_name, criu));
  std::vector<process_image::file> files;
  for (const auto& name : names_in(criu_fd.fd, criu)) {
    process_image::file f;
    f.name = name;
    struct stat st {};
    fd_guard fd(image::open_regular_file(criu_fd.fd, name, (criu / name).string(), st));
    f.bytes = static_cast<std::uint64_t>(st.st_size);
    f.checksum = checksum_of(fd.fd, f.bytes, (criu / name).string());
    if (::fsync(fd.fd) != 0) fail((criu / name).string() + ": fsync failed: " + errno_text(errno));
    files.push_back(std::move(f));
  }
  if (::fsync(criu_fd.fd) != 0) fail(criu.string() + ": fsync failed: " + errno_text(errno));
  if (files.empty()) fail(criu.string() + ": CRIU wrote no file");
  return files;
}

namespace {

nlohmann::json description_json(const process_image& p) {
  nlohmann::json j = {{"format", process_format_name},
                      {"version", p.job || !p.driver_only.empty() ? process_format_version
                                  : p.pre_copied()                ? process_format_version_pre_copy
                                                                  : process_format_version_plain},
                      {"tool_version", p.tool_version},
                      {"created", p.created},
                      {"host", p.host},
                      {"root_pid", p.root_pid},
                      {"criu_version", p.criu_version},
                      {"gpu_bytes", p.gpu_bytes},
                      {"stopped_seconds", p.stopped_seconds},
                      {"left_running", p.left_running}};
  if (!p.parent.empty()) j["parent"] = p.parent;
  if (p.job) j["job"] = true;
  if (!p.driver_only.empty()) j["driver_only"] = p.driver_only;
  j["processes"] = nlohmann::json::array();
  for (const auto& m : p.processes) {
    j["processes"].push_back({{"pid", m.pid},
                              {"parent", m.parent},
                              {"command", m.command},
                              {"image_id", m.image_id},
                              {"driver_checkpointed", m.driver_checkpointed}});
    if (!m.pre_copy_image_id.empty()) j["processes"].back()["pre_copy_image_id"] = m.pre_copy_image_id;
  }
  return j;
}

}  // namespace

void write_process_manifest(const fs::path& dir, const process_image& p) {
  nlohmann::json j = description_json(p);
  j["criu_files"] = nlohmann::json::array();
  for (const auto& f : p.criu_files)
    j["criu_files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"checksum", hex16(f.checksum)}});
  write_synced(dir, process_manifest_name, j.dump(2) + "\n");
}

void commit_process_image(const fs::path& staging, const fs::path& final_name) {
  commit_directory(staging, final_name);
}

void write_process_intent(const fs::path& dir, const process_image& p) {
  write_synced(dir, process_intent_name, description_json(p).dump(2) + "\n");
}

}  // namespace vmmckpt::ckpt
