// CRIU's pstree.img and core images read without CRIU: which processes a whole-process image brings back, with
// which pids, and whether CRIU found one stopped by a signal.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "base/image_files.hpp"
#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/image/image.hpp"
#include "vmmckpt/support/little_endian.hpp"

namespace vmmckpt::ckpt {
namespace {

// criu/include/magic.h: every image starts with the common magic, then its own.
constexpr std::uint32_t criu_common_magic = 0x54564319;  // "Sarov"
constexpr std::uint32_t pstree_magic = 0x50273030;       // "Kyiv"
constexpr std::uint32_t core_magic = 0x55053847;         // "Kolomna"
// images/core.proto: core_entry's task core is field 3 (tc), its task_state field 1; criu/include/pstree.h's
// TASK_STOPPED: what CRIU records for a task it found stopped by a signal, and restores stopped.
constexpr std::uint64_t core_task_core_field = 3;
constexpr std::uint64_t task_state_field = 1;
constexpr std::uint64_t task_stopped = 3;
// A pstree.img of a few processes is some tens of bytes; anything near this is not CRIU's.
constexpr std::uint64_t max_criu_file_bytes = 4u << 20;
constexpr std::uint32_t max_entry_bytes = 1u << 20;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw image::image_error(where + ": " + what + " (not a CRIU process tree this cuda-ckpt reads)");
}

// A protobuf varint at p, advancing it; false past `end` or beyond 64 bits.
bool varint(const unsigned char*& p, const unsigned char* end, std::uint64_t& out) {
  out = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const unsigned char b = *p++;
    out |= static_cast<std::uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return shift < 63 || b <= 1;
  }
  return false;
}

// One pstree_entry (images/pstree.proto: pid = 1, ppid = 2, pgid = 3, sid = 4, threads = 5); only pid and
// ppid are kept, every field is skipped by its wire type.
void decode_entry(const unsigned char* p, const unsigned char* end, const std::string& where, pid_t& pid, pid_t& ppid) {
  bool have_pid = false, have_ppid = false;
  while (p < end) {
    std::uint64_t key = 0, value = 0;
    if (!varint(p, end, key)) fail(where, "a malformed field key");
    const std::uint64_t field = key >> 3, wire = key & 7;
    if (wire == 0) {
      if (!varint(p, end, value)) fail(where, "a malformed number");
    } else if (wire == 2) {
      if (!varint(p, end, value) || value > static_cast<std::uint64_t>(end - p)) fail(where, "a field past its entry");
      p += value;
      continue;
    } else if (wire == 5 && end - p >= 4) {
      p += 4;
      continue;
    } else if (wire == 1 && end - p >= 8) {
      p += 8;
      continue;
    } else {
      fail(where, "a field of unknown wire type " + std::to_string(wire));
    }
    if (field == 1 || field == 2) {
      if (value > static_cast<std::uint64_t>(image_files::pid_limit))
        fail(where, "a pid of " + std::to_string(value) + ", beyond the kernel's largest");
      (field == 1 ? pid : ppid) = static_cast<pid_t>(value);
      (field == 1 ? have_pid : have_ppid) = true;
    }
  }
  if (!have_pid || !have_ppid || pid <= 0) fail(where, "an entry without its pid or parent");
}


// CRIU's file `name` of criu_dir: a regular file, never through a symbolic link, refused (image_error) when it is
// larger than a few MiB (no image of a few processes is).
std::string read_criu_file(const std::filesystem::path& criu_dir, const std::string& name) {
  const image_files::fd_guard dir(::open(criu_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.fd < 0)
    throw image::image_error(criu_dir.string() + ": cannot open CRIU's directory: " + std::strerror(errno));
  return image_files::read_small_file(dir.fd, name, criu_dir / name, max_criu_file_bytes);
}

// The first field `field` of wire type `wire` (0: a number, into *number; 2: bytes, into out) in a protobuf
// message; false when it has none or is malformed.
bool field_of(std::string_view message, std::uint64_t field, std::uint64_t wire, std::string_view& out,
              std::uint64_t* number = nullptr) {
  const auto* p = reinterpret_cast<const unsigned char*>(message.data());
  const auto* end = p + message.size();
  while (p < end) {
    std::uint64_t key = 0, value = 0;
    if (!varint(p, end, key)) return false;
    const std::uint64_t f = key >> 3, w = key & 7;
    if (w == 0) {
      if (!varint(p, end, value)) return false;
      if (f == field && wire == 0) {
        if (number != nullptr) *number = value;
        return true;
      }
    } else if (w == 2) {
      if (!varint(p, end, value) || value > static_cast<std::uint64_t>(end - p)) return false;
      if (f == field && wire == 2) {
        out = std::string_view(reinterpret_cast<const char*>(p), value);
        return true;
      }
      p += value;
    } else if (w == 5 && end - p >= 4) {
      p += 4;
    } else if (w == 1 && end - p >= 8) {
      p += 8;
    } else {
      return false;
    }
  }
  return false;
}

}  // namespace

criu_process_tree parse_criu_pstree(std::string_view bytes, const std::string& where) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto* end = p + bytes.size();
  if (bytes.size() < 8 || get_le(p, 4) != criu_common_magic || get_le(p + 4, 4) != pstree_magic)
    fail(where, "no pstree magic");
  p += 8;
  criu_process_tree tree;
  std::set<pid_t> seen;
  while (p < end) {
    if (end - p < 4) fail(where, "a truncated entry size");
    const std::uint32_t size = static_cast<std::uint32_t>(get_le(p, 4));
    p += 4;
    if (size > max_entry_bytes || size > static_cast<std::uint64_t>(end - p))
      fail(where, "an entry past the file's end");
    pid_t pid = 0, ppid = 0;
    decode_entry(p, p + size, where, pid, ppid);
    p += size;
    if (!seen.insert(pid).second) fail(where, "pid " + std::to_string(pid) + " twice");
    // CRIU writes the root first, its parent outside the tree (0); every other entry's parent comes before it.
    if (tree.pids.empty() ? ppid != 0 : seen.count(ppid) == 0) fail(where, "entries out of tree order");
    tree.pids.push_back(pid);
    tree.parents.push_back(ppid);
  }
  if (tree.pids.empty()) fail(where, "no process");
  return tree;
}

criu_process_tree read_criu_pstree(const std::filesystem::path& criu_dir) {
  const std::string path = (criu_dir / "pstree.img").string();
  return parse_criu_pstree(read_criu_file(criu_dir, "pstree.img"), path);
}

bool criu_task_stopped(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto* end = p + bytes.size();
  if (bytes.size() < 12 || get_le(p, 4) != criu_common_magic || get_le(p + 4, 4) != core_magic) return false;
  const std::uint64_t size = get_le(p + 8, 4);
  p += 12;
  if (size > static_cast<std::uint64_t>(end - p)) return false;
  std::string_view entry(reinterpret_cast<const char*>(p), size), task;
  std::uint64_t state = 0;
  return field_of(entry, core_task_core_field, 2, task) && field_of(task, task_state_field, 0, task, &state) &&
         state == task_stopped;
}

std::vector<pid_t> criu_stopped_tasks(const std::filesystem::path& criu_dir, const std::vector<pid_t>& pids) {
  std::vector<pid_t> stopped;
  for (const pid_t pid : pids) {
    try {
      if (criu_task_stopped(read_criu_file(criu_dir, "core-" + std::to_string(pid) + ".img"))) stopped.push_back(pid);
    } catch (const image::image_error&) {
      // No core image, or not a file: CRIU's restore refuses it, naming what is wrong.
    }
  }
  return stopped;
}

}  // namespace vmmckpt::ckpt
