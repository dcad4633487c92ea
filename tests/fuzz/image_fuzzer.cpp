// libFuzzer target: the input is a whole image (manifest, tables, data files) handed to reader::open, verify_data and read.
//
// Input format (what tests/fuzz/make_seeds.cpp writes into tests/fuzz/corpus/image/):
//   bytes 0..3   manifest length L, unsigned 32-bit little-endian, clamped to what follows
//   bytes 4..4+L manifest.json
//   the rest     tables.bin, then data.bin, data.1.bin, data.2.bin ... each after the separator below
//                (at most 8 data files)
//   optionally, after the line --vmmckpt-parent-image--, a parent image in the same form, written next to
//   the image as the directory `parent` (the seeds' incremental images name it by that relative path)
// Shorter than 4 bytes: the whole input is the manifest and the other files are empty.
#include <fcntl.h>
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

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "vmmckpt/image/image.hpp"

namespace {

namespace img = vmmckpt::image;

// Extents above this are not read into memory (the data file bounds them anyway, since libFuzzer's
// -max_len bounds the input; the cap only keeps a mistake in the reader from costing a huge buffer).
constexpr std::uint64_t max_read = 64ULL << 20;

// One private directory per process, reused for every input: creating and removing a directory per
// run would cost more than the reader itself. It lives under $VMMCKPT_FUZZ_TMPDIR (scripts/fuzz.sh
// sets it and removes it afterwards), else /dev/shm (the files are rewritten thousands of times a
// second), else $TMPDIR or /tmp; it is also removed when the process exits normally.
char dir_text[4096];

const std::filesystem::path& base_dir() {
  static const std::filesystem::path dir = [] {
    std::string base;
    if (const char* t = std::getenv("VMMCKPT_FUZZ_TMPDIR"); t != nullptr && *t != '\0') {
      base = t;
    } else if (::access("/dev/shm", W_OK) == 0) {
      base = "/dev/shm";
    } else {
      const char* t2 = std::getenv("TMPDIR");
      base = (t2 != nullptr && *t2 != '\0') ? t2 : "/tmp";
    }
    const std::string tmpl = base + "/vmmckpt-fuzz-image-XXXXXX";
    if (tmpl.size() >= sizeof dir_text) {
      std::fprintf(stderr, "image_fuzzer: temporary directory name too long\n");
      std::abort();
    }
    std::memcpy(dir_text, tmpl.c_str(), tmpl.size() + 1);
    if (::mkdtemp(dir_text) == nullptr) {
      std::perror("image_fuzzer: mkdtemp");
      std::abort();
    }
    // A plain buffer, not `dir`: exit handlers may run after function-local statics are destroyed.
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir_text, ec);
    });
    std::filesystem::create_directory(std::filesystem::path(dir_text) / "image");
    std::filesystem::create_directory(std::filesystem::path(dir_text) / "parent");
    return std::filesystem::path(dir_text);
  }();
  return dir;
}

// Where an input's image goes, and its parent beside it.
const std::filesystem::path& image_dir() {
  static const std::filesystem::path dir = base_dir() / "image";
  return dir;
}
const std::filesystem::path& parent_dir() {
  static const std::filesystem::path dir = base_dir() / "parent";
  return dir;
}

// Separates the files in an input (also in tests/fuzz/manifest.dict, so mutations make and drop it).
constexpr std::string_view file_separator = "\n--vmmckpt-next-data-file--\n";
constexpr std::size_t max_files = 9;  // tables.bin and up to 8 data files
// Separates an image from its parent (also in tests/fuzz/manifest.dict).
constexpr std::string_view parent_separator = "\n--vmmckpt-parent-image--\n";

struct piece {
  const std::uint8_t* p;
  std::size_t n;
};

std::vector<piece> split_files(const std::uint8_t* p, std::size_t n) {
  std::vector<piece> out;
  const auto* end = p + n;
  while (out.size() + 1 < max_files) {
    const auto* at = std::search(p, end, file_separator.begin(), file_separator.end());
    if (at == end) break;
    out.push_back({p, static_cast<std::size_t>(at - p)});
    p = at + file_separator.size();
  }
  out.push_back({p, static_cast<std::size_t>(end - p)});
  return out;
}

std::string data_file_name(std::size_t k) { return k == 0 ? "data.bin" : "data." + std::to_string(k) + ".bin"; }

// A failure here is the harness's, not the reader's: abort so it is never mistaken for a finding
// that the reader refused.
void write_file(const std::filesystem::path& path, const std::uint8_t* p, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(("image_fuzzer: open " + path.string()).c_str());
    std::abort();
  }
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      std::perror(("image_fuzzer: write " + path.string()).c_str());
      std::abort();
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  ::close(fd);
}

// Refusals are printed to terminals (cuda-ckpt verify): a message must not carry raw bytes of the
// hostile file, such as escape sequences or broken UTF-8. The paths in them are ours, hence ASCII.
void check_message(const img::image_error& e) {
  for (const char* c = e.what(); *c != '\0'; ++c) {
    const auto b = static_cast<unsigned char>(*c);
    if (b < 0x20 || b >= 0x7f) {
      std::fprintf(stderr, "%s: refusal message holds byte 0x%02x at %td\n", "image_fuzzer", b, c - e.what());
      std::abort();
    }
  }
}

// What verify_data must conclude, worked out independently of the reader: the manifest's XXH3-64
// must equal what every data file's header records (bytes 24..31), and every extent must read back.
// Files beyond those the manifest names are never opened, so only its data_files count.
bool manifest_checksum_matches(const std::uint8_t* manifest, std::size_t manifest_len, const std::vector<piece>& files,
                               std::size_t named) {
  const std::uint64_t sum = XXH3_64bits(manifest, manifest_len);
  for (std::size_t k = 0; k < std::min(named, files.size()); ++k) {
    if (files[k].n < 32) return false;  // open() refuses such a data file before this matters
    std::uint64_t recorded = 0;
    for (int i = 0; i < 8; ++i) recorded |= static_cast<std::uint64_t>(files[k].p[24 + i]) << (8 * i);
    if (recorded != sum) return false;
  }
  return true;
}

// One image of an input, as written into its directory: its manifest and its data files.
struct written_image {
  const std::uint8_t* manifest = nullptr;
  std::size_t manifest_len = 0;
  std::vector<piece> data_files;
};

// Writes an image in the input's form (length, manifest, tables, data files) into `dir`.
written_image write_image(const std::filesystem::path& dir, const std::uint8_t* data, std::size_t size) {
  written_image out;
  std::size_t manifest_len = size;
  std::size_t skip = 0;
  if (size >= 4) {
    std::uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= static_cast<std::uint32_t>(data[i]) << (8 * i);
    skip = 4;
    manifest_len = std::min<std::size_t>(len, size - 4);
  }
  write_file(dir / "manifest.json", data + skip, manifest_len);
  auto files = split_files(data + skip + manifest_len, size - skip - manifest_len);
  write_file(dir / "tables.bin", files[0].p, files[0].n);
  files.erase(files.begin());
  for (std::size_t k = 0; k + 1 < max_files; ++k) {
    if (k < files.size())
      write_file(dir / data_file_name(k), files[k].p, files[k].n);
    else
      ::unlink((dir / data_file_name(k)).c_str());  // left by an earlier input
  }
  out.manifest = data + skip;
  out.manifest_len = manifest_len;
  out.data_files = std::move(files);
  return out;
}

void check_image(const std::filesystem::path& dir, const written_image& image, const written_image* parent) {
  const std::uint8_t* manifest = image.manifest;
  const std::size_t manifest_len = image.manifest_len;
  const std::vector<piece>& data_files = image.data_files;
  const img::reader r = img::reader::open(dir);
  const img::manifest& m = r.info();
  bool manifest_matches = manifest_checksum_matches(manifest, manifest_len, data_files, m.data_files);
  // A parent's manifest is checked against its data files' headers too (verify_manifest follows the chain).
  if (r.parent() != nullptr && parent != nullptr)
    manifest_matches = manifest_matches && manifest_checksum_matches(parent->manifest, parent->manifest_len,
                                                                     parent->data_files, r.parent()->info().data_files);
  // open() promises a manifest that passes validate(): a refusal here is a reader bug, not a defect.
  try {
    img::validate(m);
  } catch (const img::image_error& e) {
    std::fprintf(stderr, "image_fuzzer: open() accepted a manifest that validate() refuses: %s\n", e.what());
    std::abort();
  }

  bool data_good = true;
  try {
    r.verify_data();
  } catch (const img::image_error&) {
    data_good = false;  // a changed manifest or a bad extent: checked against read() and the header below
  }

  static std::vector<unsigned char> buffer;
  bool all_read = true, skipped = false;
  for (const auto& p : m.pools) {
    for (const auto& e : p.extents) {
      if (e.stored > max_read) {
        skipped = true;
        continue;
      }
      buffer.resize(e.stored);
      try {
        r.read(e, buffer.data());
      } catch (const img::image_error&) {
        all_read = false;
      }
      // read_part inside the extent must work whatever the checksum (open() checked the file's size);
      // past its end it must be refused.
      const std::uint64_t part = e.stored < 4096 ? e.stored : 4096;
      try {
        r.read_part(e, e.stored - part, part, buffer.data());
      } catch (const img::image_error& err) {
        std::fprintf(stderr, "image_fuzzer: read_part inside an extent was refused: %s\n", err.what());
        std::abort();
      }
      bool refused = false;
      try {
        r.read_part(e, e.stored, 1, buffer.data());
      } catch (const img::image_error&) {
        refused = true;
      }
      if (!refused) {
        std::fprintf(stderr, "image_fuzzer: read_part past the end of an extent was not refused\n");
        std::abort();
      }
    }
  }
  if (!skipped && data_good != (all_read && manifest_matches)) {
    std::fprintf(stderr, "image_fuzzer: verify_data says %s but reading every extent %s and the manifest checksum %s\n",
                 data_good ? "good" : "bad", all_read ? "succeeded" : "failed",
                 manifest_matches ? "matches" : "differs");
    std::abort();
  }

  // Each allocation of a good image reads whole through read_range, and its bytes are those its
  // extents' stored runs place there.
  if (data_good && !skipped) {
    for (const auto& p : m.pools)
      for (const auto& a : p.allocations) {
        if (a.size > max_read) continue;
        std::vector<unsigned char> got, expected(a.size);
        try {
          r.read_range(a.addr, a.size, [&](const unsigned char* b, std::size_t n) { got.insert(got.end(), b, b + n); });
        } catch (const img::image_error& err) {
          std::fprintf(stderr, "image_fuzzer: read_range of an allocation of a good image failed: %s\n", err.what());
          std::abort();
        }
        for (const auto& e : p.extents) {
          if (e.addr >= a.addr + a.size || a.addr >= e.addr + e.size) continue;
          buffer.resize(e.stored);
          r.read(e, buffer.data());
          for (const auto& run : img::stored_runs(p, e))
            if (run.addr >= a.addr && run.addr < a.addr + a.size)
              std::copy(buffer.begin() + static_cast<std::ptrdiff_t>(run.offset),
                        buffer.begin() + static_cast<std::ptrdiff_t>(run.offset + run.size),
                        expected.begin() + static_cast<std::ptrdiff_t>(run.addr - a.addr));
        }
        if (got != expected) {
          std::fprintf(stderr, "image_fuzzer: read_range of the allocation at 0x%llx differs from its extents\n",
                       static_cast<unsigned long long>(a.addr));
          std::abort();
        }
      }
  }

  // An extent the image does not hold (here: a shifted offset) must be refused, not read.
  if (!m.pools.empty() && !m.pools[0].extents.empty()) {
    img::extent foreign = m.pools[0].extents[0];
    foreign.offset += 1;
    bool refused = false;
    try {
      r.read(foreign, buffer.data());
    } catch (const img::image_error&) {
      refused = true;
    }
    if (!refused) {
      std::fprintf(stderr, "image_fuzzer: read of an extent not in the image was not refused\n");
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path& dir = image_dir();
  const auto* end = data + size;
  const auto* split = std::search(data, end, parent_separator.begin(), parent_separator.end());
  const written_image image = write_image(dir, data, static_cast<std::size_t>(split - data));
  written_image parent;
  const bool has_parent = split != end;
  if (has_parent) {
    const auto* p = split + parent_separator.size();
    parent = write_image(parent_dir(), p, static_cast<std::size_t>(end - p));
  } else {
    ::unlink((parent_dir() / "manifest.json").c_str());  // no parent: whatever names one finds it missing
  }

  try {
    check_image(dir, image, has_parent ? &parent : nullptr);
  } catch (const img::image_error& e) {
    check_message(e);
    // The expected refusal of a defective image. Anything else escaping is a bug: libFuzzer
    // reports an uncaught exception as a crash.
  }
  return 0;
}
