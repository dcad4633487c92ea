// Unit tests of the cut's arithmetic (ckpt/src/job/cut_plan.hpp): targets from the ranks' counts, collectives and
// point-to-point pairs, and when a rank stands at them. No process, no GPU.
#include <catch2/catch.hpp>

#include "job/cut_plan.hpp"

using namespace vmmckpt;
using control::comm_count;
using control::cut_status;

namespace {

constexpr std::uint64_t world = 0x1111, pairs = 0x2222;

cut_status rank_status(std::vector<comm_count> comms, int in_flight = 0, int waiting = 1) {
  return cut_status{true, waiting, in_flight, waiting > 0 ? "ncclAllReduce" : "", std::move(comms)};
}

}  // namespace

TEST_CASE("cut: every rank is aimed at the collectives of the member furthest on", "[cut]") {
  const std::vector<cut_status> ranks = {rank_status({{world, 0, 3, 17, {}, {}}}),
                                         rank_status({{world, 1, 3, 18, {}, {}}}),
                                         rank_status({{world, 2, 3, 16, {}, {}}})};
  const auto targets = ckpt::cut_targets(ranks);
  REQUIRE(targets.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    REQUIRE(targets[i].size() == 1);
    CHECK(targets[i][0].ops == 18);
    CHECK(targets[i][0].rank == static_cast<int>(i));
  }
  CHECK_FALSE(ckpt::at_cut(ranks[0], targets[0]));
  CHECK(ckpt::at_cut(ranks[1], targets[1]));
  CHECK_FALSE(ckpt::at_cut(ranks[2], targets[2]));
  const std::string behind = ckpt::against_targets(ranks[2], targets[2]);
  CHECK_THAT(behind, Catch::Contains("waiting in ncclAllReduce"));
  CHECK_THAT(behind, Catch::Contains("16 of 18 collectives"));
}

TEST_CASE("cut: a send is matched with its receive, whichever side is ahead", "[cut]") {
  // Rank 0 sent 5 to rank 1, which received 4 of them; rank 1 sent 2 to rank 0, which received 3 (it is ahead).
  const std::vector<cut_status> ranks = {rank_status({{pairs, 0, 2, 1, {{1, 5}}, {{1, 3}}}}),
                                         rank_status({{pairs, 1, 2, 1, {{0, 2}}, {{0, 4}}}})};
  const auto targets = ckpt::cut_targets(ranks);
  REQUIRE(targets[0].size() == 1);
  CHECK(targets[0][0].sends == std::vector<control::peer_count>{{1, 5}});
  CHECK(targets[0][0].recvs == std::vector<control::peer_count>{{1, 3}});
  CHECK(targets[1][0].sends == std::vector<control::peer_count>{{0, 3}});
  CHECK(targets[1][0].recvs == std::vector<control::peer_count>{{0, 5}});
  CHECK(ckpt::at_cut(ranks[0], targets[0]));
  CHECK_FALSE(ckpt::at_cut(ranks[1], targets[1]));
  CHECK_THAT(ckpt::against_targets(ranks[1], targets[1]), Catch::Contains("2 of 3 sends to rank 0"));
  CHECK_THAT(ckpt::against_targets(ranks[1], targets[1]), Catch::Contains("4 of 5 receives from rank 0"));
}

TEST_CASE("cut: a rank with an NCCL call under way is not at the cut, whatever its counts", "[cut]") {
  const std::vector<cut_status> ranks = {rank_status({{world, 0, 2, 7, {}, {}}}, 1, 0),
                                         rank_status({{world, 1, 2, 7, {}, {}}})};
  const auto targets = ckpt::cut_targets(ranks);
  CHECK_FALSE(ckpt::at_cut(ranks[0], targets[0]));
  CHECK(ckpt::at_cut(ranks[1], targets[1]));
  CHECK_THAT(ckpt::against_targets(ranks[0], targets[0]), Catch::Contains("inside an NCCL call"));
}

TEST_CASE("cut: communicators of a subset of the ranks are aimed only at their members", "[cut]") {
  // A split: ranks 0 and 2 share one communicator, ranks 1 and 3 another of another id; all share the world.
  constexpr std::uint64_t even = 0x3333, odd = 0x4444;
  const std::vector<cut_status> ranks = {rank_status({{world, 0, 4, 9, {}, {}}, {even, 0, 2, 3, {}, {}}}),
                                         rank_status({{world, 1, 4, 9, {}, {}}, {odd, 0, 2, 2, {}, {}}}),
                                         rank_status({{world, 2, 4, 9, {}, {}}, {even, 1, 2, 4, {}, {}}}),
                                         rank_status({{world, 3, 4, 9, {}, {}}, {odd, 1, 2, 2, {}, {}}})};
  const auto targets = ckpt::cut_targets(ranks);
  CHECK(targets[0][1].ops == 4);  // the even pair's furthest
  CHECK(targets[1][1].ops == 2);  // the odd pair is not aimed at the even pair's count
  CHECK_FALSE(ckpt::at_cut(ranks[0], targets[0]));
  CHECK(ckpt::at_cut(ranks[1], targets[1]));
  CHECK(ckpt::at_cut(ranks[2], targets[2]));
  CHECK(ckpt::at_cut(ranks[3], targets[3]));
}

TEST_CASE("cut: a process without NCCL is at the cut at once", "[cut]") {
  const std::vector<cut_status> ranks = {rank_status({}, 0, 0), rank_status({{world, 0, 1, 5, {}, {}}})};
  const auto targets = ckpt::cut_targets(ranks);
  CHECK(targets[0].empty());
  CHECK(ckpt::at_cut(ranks[0], targets[0]));
  CHECK_THAT(ckpt::against_targets(ranks[0], targets[0]), Catch::Contains("not at an NCCL call"));
}
