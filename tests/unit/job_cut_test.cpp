// Unit tests of the shim's side of a job's cut (shim/src/operations/job_cut.cpp): NCCL operations counted per
// communicator, groups counted at their end, and threads held at their next NCCL call while the cut holds the
// process. No NCCL: the entry points' calls are made here directly.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "operations/job_cut.hpp"

using namespace vmmckpt;
namespace cut = vmmckpt::detail::job_cut;
using op = cut::operation;
using namespace std::chrono_literals;

namespace {

// The process's count on the communicator of `id` (the cut's state is the process's: each test makes its own).
control::comm_count counted(std::uint64_t id) {
  for (const auto& c : cut::status().comms)
    if (c.id == id) return c;
  FAIL("no communicator " << id);
  return {};
}

// Makes a communicator of a fresh id, rank `rank` of `size`, bound to the handle `comm`.
std::uint64_t make_comm(void* comm, int rank, int size) {
  static std::uint64_t next = 1;
  const std::uint64_t seed = next++ * 7919;
  const std::uint64_t id = cut::id_of_unique_ids(&seed, sizeof seed);
  cut::creation created("ncclCommInitRank", id, rank, size);
  created.bind(comm, rank, size);
  return id;
}

bool eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 2000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

}  // namespace

TEST_CASE("job cut: collectives and point-to-point operations are counted per communicator", "[job_cut]") {
  int handle = 0;
  const std::uint64_t id = make_comm(&handle, 1, 3);
  CHECK(counted(id).ops == 1);  // its creation
  { op a("ncclAllReduce", &handle, op::kind::collective); }
  { op s("ncclSend", &handle, op::kind::send, 2); }
  { op r("ncclRecv", &handle, op::kind::recv, 0); }
  const auto c = counted(id);
  CHECK(c.rank == 1);
  CHECK(c.size == 3);
  CHECK(c.ops == 2);
  CHECK(c.sends == std::vector<control::peer_count>{{2, 1}});
  CHECK(c.recvs == std::vector<control::peer_count>{{0, 1}});
  CHECK(cut::status().in_flight == 0);
}

TEST_CASE("job cut: a group ended without launching it (ncclGroupSimulateEnd) counts nothing", "[job_cut]") {
  int handle = 0;
  const std::uint64_t id = make_comm(&handle, 0, 2);
  cut::group_start("ncclGroupStart");
  { op a("ncclAllReduce", &handle, op::kind::collective); }
  cut::group_end(/*issued=*/false);
  cut::group_returned();
  CHECK(counted(id).ops == 1);  // its creation only
  CHECK(cut::status().in_flight == 0);
}

TEST_CASE("job cut: a peer NCCL would refuse is not counted", "[job_cut]") {
  int handle = 0;
  const std::uint64_t id = make_comm(&handle, 0, 2);
  { op s("ncclSend", &handle, op::kind::send, 2); }
  { op r("ncclRecv", &handle, op::kind::recv, -1); }
  CHECK(counted(id).sends.empty());
  CHECK(counted(id).recvs.empty());
}

TEST_CASE("job cut: a group's operations count when its outermost end is called", "[job_cut]") {
  int handle = 0;
  const std::uint64_t id = make_comm(&handle, 0, 2);
  cut::group_start("ncclGroupStart");
  cut::group_start("ncclGroupStart");  // nested
  { op s("ncclSend", &handle, op::kind::send, 1); }
  { op r("ncclRecv", &handle, op::kind::recv, 1); }
  cut::group_end();
  cut::group_returned();
  CHECK(counted(id).sends.empty());  // the inner end issues nothing
  CHECK(cut::status().in_flight == 1);
  cut::group_end();
  CHECK(counted(id).sends == std::vector<control::peer_count>{{1, 1}});
  CHECK(counted(id).recvs == std::vector<control::peer_count>{{1, 1}});
  cut::group_returned();
  CHECK(cut::status().in_flight == 0);
}

TEST_CASE("job cut: armed, a thread waits at its next NCCL call until its targets let it go on", "[job_cut]") {
  int handle = 0;
  const std::uint64_t id = make_comm(&handle, 0, 2);
  const std::uint64_t session = cut::arm(std::chrono::steady_clock::now() + 30s);
  REQUIRE(session != 0);
  CHECK(cut::arm(std::chrono::steady_clock::now() + 30s) == 0);  // one cut at a time
  std::atomic<int> issued{0};
  std::thread rank([&] {
    for (int i = 0; i < 3; ++i) {
      op a("ncclAllReduce", &handle, op::kind::collective);
      ++issued;
    }
  });
  // No targets yet: it stops at its first call, before issuing it.
  REQUIRE(eventually([] { return cut::status().waiting == 1; }));
  CHECK(issued == 0);
  CHECK(cut::status().where == "ncclAllReduce");
  // Aimed two collectives further: it issues those two and stops before the third.
  cut::set_targets({{id, 0, 0, counted(id).ops + 2, {}, {}}});
  REQUIRE(eventually([&] { return issued == 2 && cut::status().waiting == 1; }));
  std::this_thread::sleep_for(20ms);
  CHECK(issued == 2);
  cut::disarm(session + 1);  // another session's end disarms nothing
  std::this_thread::sleep_for(20ms);
  CHECK(issued == 2);
  cut::disarm(session);
  rank.join();
  CHECK(issued == 3);
}

TEST_CASE("job cut: making a communicator is held only once the cut is frozen, and is in flight until it returns",
          "[job_cut]") {
  const std::uint64_t session = cut::arm(std::chrono::steady_clock::now() + 30s);
  REQUIRE(session != 0);
  int handle = 0;
  std::uint64_t id = 0;
  {
    const std::uint64_t seed = 424242;
    id = cut::id_of_unique_ids(&seed, sizeof seed);
    cut::creation made("ncclCommInitRank", id, 0, 2);  // returns at once although armed
    CHECK(cut::status().in_flight == 1);
    made.bind(&handle, 0, 2);
  }
  CHECK(cut::status().in_flight == 0);
  CHECK(counted(id).ops == 1);
  // Every rank at the cut: the tool freezes it, and a communicator about to be made waits too.
  cut::set_targets({}, /*freeze=*/true);
  std::atomic<bool> made{false};
  std::thread maker([&] {
    const std::uint64_t seed = 434343;
    cut::creation another("ncclCommInitRank", cut::id_of_unique_ids(&seed, sizeof seed), 0, 2);
    made = true;
  });
  REQUIRE(eventually([] { return cut::status().waiting == 1; }));
  CHECK_FALSE(made);
  cut::disarm(session);
  maker.join();
  CHECK(made);
}

TEST_CASE("job cut: a suspended job's rank stays at its NCCL calls, armed or not, until it runs again", "[job_cut]") {
  int handle = 0;
  make_comm(&handle, 0, 2);
  cut::hold_while_suspended(true);
  std::atomic<bool> issued{false};
  std::thread rank([&] {
    op a("ncclAllReduce", &handle, op::kind::collective);
    issued = true;
  });
  REQUIRE(eventually([] { return cut::status().waiting == 1; }));
  CHECK_FALSE(issued);
  cut::hold_while_suspended(false);
  rank.join();
  CHECK(issued);
}

TEST_CASE("job cut: the deadline lets every thread go even when nobody disarms", "[job_cut]") {
  int handle = 0;
  make_comm(&handle, 0, 2);
  const std::uint64_t session = cut::arm(std::chrono::steady_clock::now() + 100ms);
  REQUIRE(session != 0);
  const auto start = std::chrono::steady_clock::now();
  { op a("ncclAllReduce", &handle, op::kind::collective); }
  CHECK(std::chrono::steady_clock::now() - start >= 90ms);
  CHECK_FALSE(cut::armed());
  cut::disarm(session);
}

TEST_CASE("job cut: communicators split from one parent get the same identity on every rank", "[job_cut]") {
  // Two ranks of one communicator (here in one process, as ncclCommInitAll makes them): the same unique id.
  int rank0 = 0, rank1 = 0;
  const std::uint64_t seed = 777;
  const std::uint64_t id = cut::id_of_unique_ids(&seed, sizeof seed);
  for (auto [handle, rank] : {std::pair{&rank0, 0}, std::pair{&rank1, 1}}) {
    cut::creation made("ncclCommInitRank", id, rank, 2);
    made.bind(handle, rank, 2);
  }
  const std::uint64_t first0 = cut::id_of_split(&rank0, 1, "ncclCommSplit");
  const std::uint64_t first1 = cut::id_of_split(&rank1, 1, "ncclCommSplit");
  CHECK(first0 == first1);
  CHECK(cut::id_of_split(&rank0, 1, "ncclCommSplit") != first0);  // the parent's next split is another
  CHECK(cut::id_of_split(&rank1, 2, "ncclCommSplit") != first1);  // another colour is another
}
