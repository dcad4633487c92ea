// The suspend claim file: its contents, and the rename that decides who wins.
#include "vmmckpt/protocol/suspend_claim.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::suspend_claim {

std::string encode(const parties& p) {
  return nlohmann::ordered_json{{"tool_pid", p.tool_pid},
                                {"tool_start", p.tool_start},
                                {"target_pid", p.target_pid},
                                {"target_start", p.target_start},
                                {"image_id", p.image_id}}
             .dump() +
         "\n";
}

bool decode(const std::string& text, parties& out) noexcept {
  try {
    using namespace json_fields;
    const json j = parse_limited(text, 2);
    out.tool_pid = static_cast<pid_t>(int_of(j, "", "tool_pid"));
    out.tool_start = u64_of(j, "", "tool_start");
    out.target_pid = static_cast<pid_t>(int_of(j, "", "target_pid"));
    out.target_start = u64_of(j, "", "target_start");
    out.image_id = string_of(j, "", "image_id");
    return true;
  } catch (...) {
    return false;
  }
}

namespace {

bool rename_in(const std::string& where, const char* from, const char* to) noexcept {
  const int dir = ::open(where.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0) return false;
  const bool won = ::renameat(dir, from, dir, to) == 0;
  if (won) ::fsync(dir);
  ::close(dir);
  return won;
}

}  // namespace

bool take(const std::string& image, const char* to) noexcept { return rename_in(image, pending, to); }

bool take_job(const std::string& dir, const char* to) noexcept { return rename_in(dir, job_pending, to); }

std::uint64_t start_time(pid_t pid) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // The command name may hold spaces and parentheses: fields count from the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  // Field 3 (state) follows ") "; the start time is field 22. A zombie is gone: it never runs again.
  if (p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X')) return 0;
  int field = 2;
  for (++p; *p != '\0' && field < 22; ++p)
    if (*p == ' ') ++field;
  unsigned long long start = 0;
  if (std::sscanf(p, "%llu", &start) != 1) return 0;
  return start;
}

bool alive(pid_t pid, std::uint64_t start) noexcept { return pid > 0 && start != 0 && start_time(pid) == start; }

}  // namespace vmmckpt::suspend_claim
