// Reads the emulator's environment variables and writes its trace lines.
#include "config.hpp"

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vmmckpt::emu {

bool parse_size(const char* text, std::uint64_t& out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || errno != 0) return false;
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    case 't':
    case 'T':
      shift = 40;
      ++end;
      break;
    default: return false;
  }
  // Accept "16G", "16GB" and "16GiB" alike: people write all three.
  if (shift != 0 && (std::strcmp(end, "B") == 0 || std::strcmp(end, "iB") == 0)) end += std::strlen(end);
  if (*end != '\0') return false;
  if (shift != 0 && value > (~0ULL >> shift)) return false;
  out = static_cast<std::uint64_t>(value) << shift;
  return true;
}

namespace {

// The switches: one set to anything but "" or "0" gives its field `when_set`.
struct switch_variable {
  const char* name;
  bool config::*field;
  bool when_set;
};
constexpr switch_variable switches[] = {
    {"VMMCKPT_EMU_TRACE", &config::trace, true},
    {"VMMCKPT_EMU_NO_P2P", &config::peer_to_peer, false},
    {"VMMCKPT_EMU_DIRTY_MEMORY", &config::dirty_memory, true},
};

void read_device_count(config& c) {
  const char* d = std::getenv("VMMCKPT_EMU_DEVICES");
  if (d == nullptr || *d == '\0') return;
  char* end = nullptr;
  long n = std::strtol(d, &end, 10);
  if (end != d && *end == '\0' && n >= 0 && n <= max_devices) {
    c.device_count = static_cast<int>(n);
  } else if (c.trace) {
    std::fprintf(stderr, "[vmmckpt-emu] VMMCKPT_EMU_DEVICES=%s ignored (0..%d)\n", d, max_devices);
  }
}

// CUDA_VISIBLE_DEVICES selects and orders devices as on a real machine (numbers only).
void read_visible_devices(config& c) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v == nullptr) return;
  int visible = 0;
  const char* p = v;
  while (*p != '\0' && visible < 16) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 0 || n >= c.device_count) break;  // like the driver: the list stops at a bad entry
    c.physical[visible++] = static_cast<int>(n);
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') break;
  }
  c.device_count = visible;
}

void read_device_memory(config& c) {
  const char* m = std::getenv("VMMCKPT_EMU_MEM");
  if (m == nullptr || *m == '\0') return;
  std::uint64_t bytes = 0;
  if (parse_size(m, bytes) && bytes > 0) {
    c.device_memory = bytes;
  } else if (c.trace) {
    std::fprintf(stderr, "[vmmckpt-emu] VMMCKPT_EMU_MEM=%s ignored\n", m);
  }
}

config read_config() {
  config c;
  for (const auto& s : switches)
    if (const char* t = std::getenv(s.name); t != nullptr && *t != '\0' && std::strcmp(t, "0") != 0)
      c.*s.field = s.when_set;
  read_device_count(c);
  read_visible_devices(c);
  read_device_memory(c);
  return c;
}

}  // namespace

const config& settings() {
  static const config c = read_config();
  return c;
}

void trace(const char* format, ...) {
  if (!settings().trace) return;
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  // One write per line so lines from several threads do not interleave.
  std::fprintf(stderr, "[vmmckpt-emu] %s\n", line);
}

}  // namespace vmmckpt::emu
