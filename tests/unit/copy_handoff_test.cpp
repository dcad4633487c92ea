// Unit tests of parking (ckpt/src/copy/copy_handoff.hpp): while the program is held, a writer parks a chunk in
// host memory when the copier has waited for buffers and will want its buffer before the image could take it,
// within the budget.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "copy/copy_handoff.hpp"

using vmmckpt::ckpt::chunk_handoff;
using vmmckpt::ckpt::copy_run;
using vmmckpt::ckpt::copy_runs;

namespace {

constexpr std::uint64_t MiB = 1ULL << 20;

// `chunks` chunks of 1 MiB to copy, but for those in `uncopied`.
copy_runs runs_of(std::size_t chunks, const std::vector<std::size_t>& uncopied = {}) {
  copy_runs r;
  r.of.resize(chunks);
  for (std::size_t c = 0; c < chunks; ++c)
    if (std::find(uncopied.begin(), uncopied.end(), c) == uncopied.end()) r.of[c].push_back(copy_run{0, 0, MiB});
  return r;
}

// The copier's side: chunks [0, n) issued, each in a buffer of its own, and `waited` for a buffer (the writers
// were behind).
void issue(chunk_handoff& h, std::size_t n, bool waited = true) {
  double waiting = 0;
  std::size_t b;
  for (std::size_t c = 0; c < n; ++c) REQUIRE(h.take_buffer(c, waiting, b));
  h.issue(n);
  h.copier_waited = waited;
}

}  // namespace

TEST_CASE("parking: a chunk whose buffer the copies need is parked, within the budget", "[copy_handoff]") {
  const copy_runs runs = runs_of(6);
  chunk_handoff h(6, 2, 2 * MiB, true);
  h.set_runs(runs);
  issue(h, 2);  // both buffers taken, four chunks left to copy
  CHECK(h.reserve_parking(MiB, false));
  CHECK(h.reserve_parking(MiB, false));
  CHECK_FALSE(h.reserve_parking(MiB, false));  // beyond the budget: written while the program waits
  CHECK(h.parked == 2 * MiB);
  CHECK(h.held_writes == MiB);
  h.parking_failed(MiB);  // no memory for the second after all
  CHECK(h.parked == MiB);
  CHECK(h.held_writes == 2 * MiB);
  // The budget counts what is parked now: a parked chunk written (while held: waited for) makes room.
  h.parked_written(MiB);
  CHECK(h.held_writes == 3 * MiB);
  CHECK(h.reserve_parking(MiB, false));
  CHECK(h.reserve_parking(MiB, false));
  CHECK(h.parked == 3 * MiB);
}

TEST_CASE("parking: not before the copier has waited for a buffer (the image keeps up)", "[copy_handoff]") {
  const copy_runs runs = runs_of(6);
  chunk_handoff h(6, 2, 8 * MiB, true);
  h.set_runs(runs);
  issue(h, 2, /*waited=*/false);
  CHECK_FALSE(h.reserve_parking(MiB, false));
  CHECK(h.held_writes == 0);
  double waiting = 0;
  std::size_t b;
  h.written_chunk(0, MiB);  // a buffer back: the copier takes it without waiting
  REQUIRE(h.take_buffer(2, waiting, b));
  CHECK_FALSE(h.copier_waited);
}

TEST_CASE("parking: not when the free buffers take what is left to copy", "[copy_handoff]") {
  const copy_runs runs = runs_of(4, {2, 3});  // the last two need no copy, hence no buffer
  chunk_handoff h(4, 2, 8 * MiB, true);
  h.set_runs(runs);
  issue(h, 1);
  CHECK_FALSE(h.reserve_parking(MiB, false));  // one chunk left to copy, one free buffer
  CHECK(h.held_writes == 0);
  // A chunk after a parked one is parked whenever the budget allows, copied or not: its extents follow.
  CHECK(h.reserve_parking(0, true));
  CHECK(h.reserve_parking(MiB, true));
}

TEST_CASE("parking: never once the program goes on, nor for a suspend", "[copy_handoff]") {
  const copy_runs runs = runs_of(6);
  chunk_handoff dump(6, 2, 8 * MiB, true);
  dump.set_runs(runs);
  issue(dump, 2);
  dump.staged_chunk(MiB);
  REQUIRE(dump.reserve_parking(MiB, false));
  dump.release();
  dump.staged_chunk(MiB);  // after the release: not staged while held
  CHECK(dump.staged == MiB);
  CHECK_FALSE(dump.reserve_parking(MiB, false));
  CHECK_FALSE(dump.reserve_parking(MiB, true));
  dump.parked_written(MiB);  // after the release: the hold did not wait for it
  CHECK(dump.held_writes == 0);
  CHECK(dump.parked == MiB);
  dump.wait_for_release();  // returns at once
  chunk_handoff suspend(6, 2, 8 * MiB, false);
  suspend.set_runs(runs);
  issue(suspend, 2);
  CHECK_FALSE(suspend.reserve_parking(MiB, false));
  CHECK(suspend.held_writes == 0);
}

TEST_CASE("parking: a writer with parked chunks is woken by the release to write them", "[copy_handoff]") {
  const copy_runs runs = runs_of(3);
  chunk_handoff h(3, 2, 8 * MiB, true);
  h.set_runs(runs);
  issue(h, 1);
  std::size_t c, b;
  CHECK(h.take_chunk(c, b, false) == chunk_handoff::took::chunk);
  CHECK(c == 0);
  h.release();
  CHECK(h.take_chunk(c, b, true) == chunk_handoff::took::released);
}

TEST_CASE("parking: a writer whose writes run as fast as a park writes, and only writes the budget forced count",
          "[copy_handoff]") {
  const copy_runs runs = runs_of(6);
  chunk_handoff h(6, 2, MiB, true);
  h.set_runs(runs);
  issue(h, 2);
  CHECK_FALSE(h.reserve_parking(MiB, false, /*pays=*/false));  // written by choice: the hold covers a fast write
  CHECK(h.held_writes == 0);
  CHECK(h.parked == 0);
  CHECK(h.reserve_parking(MiB, false, true));
  CHECK_FALSE(h.reserve_parking(MiB, false, false));  // the budget is spent: counted, whatever the pace
  CHECK(h.held_writes == MiB);
}
