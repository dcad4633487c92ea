// CRIU's pstree.img read without CRIU: which processes a whole-process image brings back, and with which pids.
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
// A pstree.img of a few processes is some tens of bytes; anything near this is not CRIU's.
constexpr std::uint64_t max_pstree_bytes = 4u << 20;
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
  const int dir = ::open(criu_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0) throw image::image_error(criu_dir.string() + ": cannot open CRIU's directory: " + std::strerror(errno));
  struct stat st {};
  int fd = -1;
  try {
    fd = image::open_regular_file(dir, "pstree.img", path, st);
  } catch (...) {
    ::close(dir);
    throw;
  }
  ::close(dir);
  std::string bytes;
  if (static_cast<std::uint64_t>(st.st_size) <= max_pstree_bytes) {
    bytes.resize(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    bytes.resize(done);
  }
  ::close(fd);
  if (static_cast<std::uint64_t>(st.st_size) > max_pstree_bytes)
    fail(path, std::to_string(st.st_size) + " bytes, more than a process tree takes");
  return parse_criu_pstree(bytes, path);
}

}  // namespace vmmckpt::ckpt
