// libFuzzer target: a whole-process image (process.json and the directory layout around it) handed to the
// whole-process reader: read_process_image, verify_process_image (the layout, every CRIU file's size and
// checksum, each GPU part's manifest), CRIU's
// pstree.img, the intent record and the ownership walk root restores by.
//
// Input format (what tests/fuzz/make_seeds.cpp writes into tests/fuzz/corpus/process/):
//   process.json's text (none when empty), then entries, each after the line start "\n--vmmckpt-entry-- " as
//     TYPE PATH\n CONTENT
//   TYPE: f a regular file holding CONTENT, d a directory, l a symbolic link to CONTENT (the reader must never
//   follow one: /proc/kmsg would block it, caught as a timeout), p a FIFO (never opened for reading: it would
//   block). PATH is relative to the image, at most 4 plain names deep; others are skipped.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "vmmckpt/ckpt/criu.hpp"
#include "vmmckpt/ckpt/image_owner.hpp"
#include "vmmckpt/ckpt/process_image.hpp"
#include "vmmckpt/image/image.hpp"

namespace {

namespace fs = std::filesystem;
namespace ckpt = vmmckpt::ckpt;

constexpr std::string_view entry_separator = "\n--vmmckpt-entry-- ";
constexpr std::size_t max_entries = 64;
constexpr int max_depth = 4;

// One private directory per process, reused for every input (as image_fuzzer's): under $VMMCKPT_FUZZ_TMPDIR
// (scripts/fuzz.sh sets it), else /dev/shm, else /tmp; removed at a normal exit.
char base_text[4096];

const fs::path& image_dir() {
  static const fs::path dir = [] {
    std::string base = "/tmp";
    if (const char* t = std::getenv("VMMCKPT_FUZZ_TMPDIR"); t != nullptr && *t != '\0')
      base = t;
    else if (::access("/dev/shm", W_OK) == 0)
      base = "/dev/shm";
    const std::string tmpl = base + "/vmmckpt-fuzz-process-XXXXXX";
    if (tmpl.size() >= sizeof base_text) std::abort();
    std::memcpy(base_text, tmpl.c_str(), tmpl.size() + 1);
    if (::mkdtemp(base_text) == nullptr) {
      std::perror("process_image_fuzzer: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(base_text, ec);
    });
    return fs::path(base_text) / "image";
  }();
  return dir;
}

// A relative path of plain names, or empty.
fs::path plain_path(std::string_view text) {
  fs::path out;
  int depth = 0;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t slash = std::min(text.find('/', at), text.size());
    const std::string_view name = text.substr(at, slash - at);
    if (name.empty() || name == "." || name == ".." || name.size() > 64 || ++depth > max_depth ||
        name.find('\0') != std::string_view::npos)
      return {};
    out /= std::string(name);
    at = slash + 1;
  }
  return out;
}

// A failure here is the harness's, never a finding about the reader.
void write_file(const fs::path& path, std::string_view bytes) {
  // Non-blocking: an earlier entry may have made a FIFO of that name (opening it to write would wait for a
  // reader); a name taken by another entry (a directory, a link, a FIFO) is skipped.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return;
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      std::perror("process_image_fuzzer: write");
      std::abort();
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

void make_entry(const fs::path& dir, char type, const fs::path& rel, std::string_view content) {
  const fs::path path = dir / rel;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return;
  switch (type) {
    case 'f': write_file(path, content); break;
    case 'd': fs::create_directories(path, ec); break;
    case 'l': ::symlink(std::string(content.substr(0, 256)).c_str(), path.c_str()); break;
    case 'p': ::mkfifo(path.c_str(), 0600); break;
    default: break;
  }
}

void lay_out(const fs::path& dir, std::string_view input) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir / "criu", ec);
  fs::create_directories(dir / "gpu", ec);
  std::size_t at = input.find(entry_separator);
  // An empty process.json is none: an entry may then put a link or a FIFO in its place.
  if (at != 0 && !input.empty()) write_file(dir / "process.json", input.substr(0, at));
  for (std::size_t n = 0; at != std::string_view::npos && n < max_entries; ++n) {
    const std::size_t start = at + entry_separator.size();
    const std::size_t next = input.find(entry_separator, start);
    const std::string_view entry =
        input.substr(start, next == std::string_view::npos ? std::string_view::npos : next - start);
    at = next;
    const std::size_t newline = entry.find('\n');
    const std::string_view header = entry.substr(0, newline);
    if (header.size() < 3 || header[1] != ' ') continue;
    const fs::path rel = plain_path(header.substr(2));
    if (rel.empty()) continue;
    make_entry(dir, header[0], rel, newline == std::string_view::npos ? std::string_view{} : entry.substr(newline + 1));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path& dir = image_dir();
  lay_out(dir, std::string_view(reinterpret_cast<const char*>(data), size));
  // Every defect is an image_error; anything else (a crash, a sanitizer report, a hang on a link or a FIFO,
  // another exception escaping) is a finding.
  try {
    // The GPU parts' data is image_fuzzer's to fuzz: here their manifests (and every CRIU file's bytes) are
    // checked, which keeps this target at hundreds of runs a second rather than tens.
    const auto p = ckpt::read_process_image(dir);
    ckpt::verify_process_image(dir, p, false);
  } catch (const vmmckpt::image::image_error&) {
  }
  try {
    ckpt::read_criu_pstree(dir / ckpt::criu_dir_name);
  } catch (const vmmckpt::image::image_error&) {
  }
  try {
    ckpt::read_process_intent(dir);
  } catch (const vmmckpt::image::image_error&) {
  }
  try {
    ckpt::distrust_of(dir);
  } catch (const vmmckpt::image::image_error&) {
  }
  return 0;
}
