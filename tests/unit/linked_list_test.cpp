// The restore tests' linked list (contracts/linked_list.hpp), built in host memory: its walk passes a whole list and names each kind of damage.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "contracts/linked_list.hpp"

namespace ll = vmmckpt::contracts::linked_list;
using Catch::Matchers::Contains;

namespace {

// A list in host memory, built as the programs build theirs, walked in place as the GPU walks it.
struct host_list {
  std::vector<std::unique_ptr<std::uint64_t[]>> blocks;
  ll::list_file file;

  explicit host_list(std::uint64_t n) {
    const auto nodes = ll::allocate_nodes(
        n,
        [this](std::uint64_t size) {
          blocks.emplace_back(new std::uint64_t[size / 8]());
          return reinterpret_cast<std::uint64_t>(blocks.back().get());
        },
        [](std::uint64_t) {});
    const auto next = ll::next_pointers(nodes);
    for (std::uint64_t i = 0; i < n; ++i) {
      auto* words = node(nodes[i]);
      const std::uint64_t payload_words = ll::node_size(i) / 8 - ll::header_words;
      ll::write_header(words, next[i], i, payload_words);
      for (std::uint64_t w = 0; w < payload_words; ++w) words[ll::header_words + w] = ll::payload_word(i, w);
      ll::seal(words);
    }
    file = ll::describe_list(nodes, 0);
    file.checksum = walk().sum;
  }
  static std::uint64_t* node(std::uint64_t addr) { return reinterpret_cast<std::uint64_t*>(addr); }
  ll::walk_result walk() const {
    const ll::walk_tables tables(file);
    return ll::walk_list(file.head, ll::walk_tables::view(tables.words.data(), file.nodes), ll::in_place{});
  }
  std::string problem() const { return ll::walk_problem(walk(), file); }
};

}  // namespace

TEST_CASE("linked list: a whole list walks in the shuffled order with the file's checksum", "[contracts]") {
  host_list list(100);
  const auto r = list.walk();
  CHECK(r.defect == ll::defect_none);
  CHECK(r.steps == 100);
  CHECK(list.problem() == "");
  CHECK(list.file.head == list.file.addrs[ll::list_order(100)[0]]);
}

TEST_CASE("linked list: each kind of damage is named at its node", "[contracts]") {
  host_list list(100);
  const auto order = ll::list_order(100);
  const std::uint64_t third = order[2];  // the node at step 2
  auto* node = host_list::node(list.file.addrs[third]);
  const std::string at = "bad node: step 2 of the list, node " + std::to_string(third) + " at ";
  SECTION("a payload byte") {
    node[ll::header_words + 3] ^= 0x100;
    CHECK_THAT(list.problem(), Contains(at) && Contains("payload differs at byte 24"));
  }
  SECTION("the checksum") {
    node[3] ^= 1;
    CHECK_THAT(list.problem(), Contains(at) && Contains("checksum mismatch"));
  }
  // `next` is under the checksum: a changed pointer alone is caught there.
  auto set_next = [&](std::uint64_t step, std::uint64_t next, bool reseal) {
    auto* before = host_list::node(list.file.addrs[order[step]]);
    before[0] = next;
    if (reseal) ll::seal(before);
  };
  SECTION("a changed pointer") {
    set_next(1, list.file.addrs[order[5]], false);
    CHECK_THAT(list.problem(), Contains("step 1 of the list") && Contains("checksum mismatch"));
  }
  // Resealed, as a restore that moved a node and its pointers consistently would leave them.
  SECTION("a pointer that leads nowhere") {
    set_next(1, list.file.addrs[third] + 8, true);
    CHECK_THAT(list.problem(), Contains("bad node: step 2 of the list, node ?") && Contains("not a node of the file"));
  }
  SECTION("a pointer to the wrong node") {
    set_next(1, list.file.addrs[order[5]], true);
    CHECK_THAT(list.problem(), Contains("out of order: expected node " + std::to_string(third)));
  }
  SECTION("a cut list") {
    set_next(49, 0, true);
    CHECK(list.problem() == "bad node: step 50 of the list, node ? at 0x0: the list ends after 50 of 100 nodes");
  }
  SECTION("a cycle") {
    set_next(99, list.file.head, true);
    CHECK_THAT(list.problem(), Contains("step 100 of the list") && Contains("longer than the file's count"));
  }
  SECTION("a list whose checksum is not the file's") {
    list.file.checksum ^= 1;
    CHECK_THAT(list.problem(), Contains("the list's checksum is 0x"));
  }
}

TEST_CASE("linked list: the file reads back as written, and a damaged one is refused", "[contracts]") {
  host_list list(20);
  const std::string path = std::filesystem::temp_directory_path() / ("vmmckpt-list-" + std::to_string(::getpid()));
  REQUIRE(ll::write_list_file(path, list.file));
  ll::list_file back;
  std::string error;
  REQUIRE(ll::read_list_file(path, back, error));
  CHECK(back.head == list.file.head);
  CHECK(back.checksum == list.file.checksum);
  CHECK(back.addrs == list.file.addrs);
  CHECK(back.sizes == list.file.sizes);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 30);
  CHECK_FALSE(ll::read_list_file(path, back, error));
  CHECK_THAT(error, Contains("bad line for node 19"));
  std::filesystem::remove(path);
}
