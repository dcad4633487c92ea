// The busy writers' buffer pattern: written by tests/programs/emu/busy_writer.cpp and gpu/busy_kernels.cu, checked by the e2e tests and busy_pattern_check.
//
// A writer rewrites each buffer whole, generation after generation: word 0 and the last word hold the
// generation, every word k between is (generation * 0x9e3779b97f4a7c15) ^ (buffer << 40) ^ k. A
// consistent image holds every buffer whole at one generation; a copy torn between two rewrites breaks
// the pattern. Generation 0 is the buffer as allocated: the writers zero it and start at 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "host_device.hpp"

namespace vmmckpt::contracts {

inline constexpr std::uint64_t busy_multiplier = 0x9e3779b97f4a7c15ULL;

// Word k of `count` in buffer `buffer` at `generation` (from 1).
VMMCKPT_HOST_DEVICE inline std::uint64_t busy_word(std::uint64_t generation, std::uint64_t buffer, std::uint64_t k,
                                                   std::uint64_t count) {
  if (k == 0 || k + 1 == count) return generation;
  return (generation * busy_multiplier) ^ (buffer << 40) ^ k;
}

// The writers' command line: `--buffers N --streams N --seconds N --size BYTES`, each optional; the
// defaults differ between the emulator and a GPU.
struct busy_options {
  int buffers = 8;
  int streams = 1;
  int seconds = 60;
  std::size_t size = 1 << 20;
};
inline busy_options parse_busy_options(int argc, char** argv, busy_options o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--buffers")
      o.buffers = std::atoi(argv[i + 1]);
    else if (flag == "--streams")
      o.streams = std::atoi(argv[i + 1]);
    else if (flag == "--seconds")
      o.seconds = std::atoi(argv[i + 1]);
    else if (flag == "--size")
      o.size = std::strtoull(argv[i + 1], nullptr, 0);
  }
  return o;
}

// What is wrong with a buffer's words, or an empty string when they hold one whole generation. The
// buffer's number is read back from word 1: a checker need not know which buffer it holds.
inline std::string busy_problem(const std::uint64_t* words, std::size_t count) {
  if (count == 0) return "the buffer is empty";
  const std::uint64_t generation = words[0];
  if (words[count - 1] != generation)
    return "first word " + std::to_string(generation) + ", last word " + std::to_string(words[count - 1]);
  const std::uint64_t buffer = count > 2 ? (words[1] ^ (generation * busy_multiplier) ^ 1) >> 40 : 0;
  for (std::size_t k = 1; k + 1 < count; ++k) {
    const std::uint64_t expected = generation == 0 ? 0 : busy_word(generation, buffer, k, count);
    if (words[k] != expected)
      return "torn at word " + std::to_string(k) + " (generation " + std::to_string(generation) + ")";
  }
  return {};
}

}  // namespace vmmckpt::contracts
