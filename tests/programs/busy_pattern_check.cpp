// Checks that stdin holds one buffer whole at one generation of the busy writers' pattern; the GPU checks pipe `cuda-ckpt cat` into it.
//
//   cuda-ckpt cat IMAGE ADDR SIZE | busy_pattern_check [NAME]
//
// Exit 0 and "NAME: whole, generation G" when it is; exit 1 and "NAME: <what is wrong>" (from
// contracts/busy_pattern.hpp) when it is not; exit 2 when the input is not a whole number of words or
// cannot be read. The pattern is defined once, there: the python checks do not write it again.
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "contracts/busy_pattern.hpp"

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "stdin";
  std::vector<unsigned char> bytes;
  unsigned char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::printf("%s: cannot read the input: %s\n", name.c_str(), std::strerror(errno));
      return 2;
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + n);
  }
  if (bytes.empty() || bytes.size() % 8 != 0) {
    std::printf("%s: %zu bytes is not a buffer of 8-byte words\n", name.c_str(), bytes.size());
    return 2;
  }
  std::vector<std::uint64_t> words(bytes.size() / 8);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  const std::string problem = vmmckpt::contracts::busy_problem(words.data(), words.size());
  if (!problem.empty()) {
    std::printf("%s: %s\n", name.c_str(), problem.c_str());
    return 1;
  }
  std::printf("%s: whole, generation %llu\n", name.c_str(), static_cast<unsigned long long>(words[0]));
  return 0;
}
