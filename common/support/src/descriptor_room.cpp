// Room in the process's descriptor table, made before a hold rather than in it.
#include "vmmckpt/support/descriptor_room.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace vmmckpt {
namespace {

int soft_limit() noexcept {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 1 << 20));
}

}  // namespace

void grow_descriptor_table(int slots) noexcept {
  const int last = std::min(slots, soft_limit()) - 1;
  const int any = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (any < 0) return;
  // F_DUPFD takes the lowest free descriptor at or above `last`: it never replaces one in use.
  if (last > any) {
    const int high = ::fcntl(any, F_DUPFD_CLOEXEC, last);
    if (high >= 0) ::close(high);
  }
  ::close(any);
}

void make_room_for_descriptors(int count) noexcept {
  if (count <= 0) return;
  try {
    // The next `count` descriptors go to the lowest free slots: taking them once grows the table to
    // hold them, and giving them back leaves it grown.
    std::vector<int> taken;
    taken.reserve(static_cast<std::size_t>(count));
    const int first = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (first < 0) return;
    taken.push_back(first);
    while (static_cast<int>(taken.size()) < count) {
      const int fd = ::fcntl(first, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) break;  // out of descriptors: the exports would fail the same way, and say so
      taken.push_back(fd);
    }
    for (int fd : taken) ::close(fd);
  } catch (...) {
    // Out of memory for the list: no room made, the hold grows the table itself.
  }
}

}  // namespace vmmckpt
