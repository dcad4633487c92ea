// descriptor_room: the descriptor table grown ahead of need, with no descriptor left behind.
#include "vmmckpt/support/descriptor_room.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "skip.hpp"

namespace {

// FDSize in /proc/self/status: the slots the table has now.
int table_size() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("FDSize:", 0) == 0) return std::stoi(line.substr(7));
  FAIL("no FDSize in /proc/self/status");
  return -1;
}

int open_descriptors() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n - 1;  // the iterator's own
}

int soft_limit() {
  rlimit rl{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
  return rl.rlim_cur == RLIM_INFINITY ? 1 << 20 : static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 1 << 20));
}

}  // namespace

TEST_CASE("grow_descriptor_table grows the table to the slots asked for and leaves no descriptor open") {
  const int before = table_size();
  const int wanted = before * 4;
  if (wanted > soft_limit())
    VMMCKPT_SKIP("RLIMIT_NOFILE (" + std::to_string(soft_limit()) + ") leaves no room above " + std::to_string(before) +
                 " slots");
  const int open = open_descriptors();
  vmmckpt::grow_descriptor_table(wanted);
  CHECK(table_size() >= wanted);
  CHECK(open_descriptors() == open);
}

TEST_CASE("grow_descriptor_table stops at RLIMIT_NOFILE and fails no one") {
  const int open = open_descriptors();
  vmmckpt::grow_descriptor_table(1 << 30);
  CHECK(table_size() >= soft_limit());  // as far as the limit lets it
  CHECK(open_descriptors() == open);
  vmmckpt::grow_descriptor_table(0);
  vmmckpt::grow_descriptor_table(-5);
  CHECK(open_descriptors() == open);
}

TEST_CASE("make_room_for_descriptors: that many descriptors opened afterwards do not grow the table") {
  const int count = table_size() + 10;  // more than the table holds now, whatever it holds
  const int open = open_descriptors();
  if (open + count + 8 > soft_limit())
    VMMCKPT_SKIP("RLIMIT_NOFILE (" + std::to_string(soft_limit()) + ") leaves no room for " + std::to_string(count) +
                 " more descriptors");
  vmmckpt::make_room_for_descriptors(count);
  CHECK(open_descriptors() == open);
  const int room = table_size();
  std::vector<int> fds;
  for (int k = 0; k < count; ++k) {
    fds.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    REQUIRE(fds.back() >= 0);
  }
  CHECK(table_size() == room);
  for (int fd : fds) ::close(fd);
}

TEST_CASE("make_room_for_descriptors of none, or of more than the limit, leaves nothing open") {
  const int open = open_descriptors();
  vmmckpt::make_room_for_descriptors(0);
  vmmckpt::make_room_for_descriptors(-1);
  CHECK(open_descriptors() == open);
  vmmckpt::make_room_for_descriptors(soft_limit() + 100);  // stops at the limit
  CHECK(open_descriptors() == open);
}
