// The busy writers' pattern check (contracts/busy_pattern.hpp) passes whole buffers and catches torn ones.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "contracts/busy_pattern.hpp"

using vmmckpt::contracts::busy_problem;
using vmmckpt::contracts::busy_word;

namespace {

std::vector<std::uint64_t> buffer_at(std::uint64_t generation, std::uint64_t buffer, std::size_t count) {
  std::vector<std::uint64_t> words(count);
  for (std::size_t k = 0; k < count; ++k) words[k] = busy_word(generation, buffer, k, count);
  return words;
}

}  // namespace

TEST_CASE("busy pattern: a buffer whole at one generation passes, whatever its number", "[contracts]") {
  for (std::uint64_t buffer : {0, 1, 15})
    for (std::uint64_t generation : {1, 2, 1000000})
      CHECK(busy_problem(buffer_at(generation, buffer, 4096).data(), 4096) == "");
  const std::vector<std::uint64_t> zeroed(4096, 0);  // as allocated, before the first rewrite
  CHECK(busy_problem(zeroed.data(), zeroed.size()) == "");
}

TEST_CASE("busy pattern: a copy torn between two generations is caught at the first torn word", "[contracts]") {
  auto words = buffer_at(7, 3, 4096);
  const auto next = buffer_at(8, 3, 4096);
  SECTION("the front rewritten, the back not") {
    std::copy(next.begin(), next.begin() + 1000, words.begin());
    CHECK(busy_problem(words.data(), words.size()) == "first word 8, last word 7");
  }
  SECTION("the middle rewritten, both ends not") {
    std::copy(next.begin() + 1000, next.begin() + 2000, words.begin() + 1000);
    CHECK(busy_problem(words.data(), words.size()) == "torn at word 1000 (generation 7)");
  }
  SECTION("a word of another buffer") {
    words[17] = busy_word(7, 4, 17, 4096);
    CHECK(busy_problem(words.data(), words.size()) == "torn at word 17 (generation 7)");
  }
  SECTION("generation 0 with a word written") {
    std::vector<std::uint64_t> zeroed(4096, 0);
    zeroed[5] = 1;
    CHECK(busy_problem(zeroed.data(), zeroed.size()) == "torn at word 5 (generation 0)");
  }
}
