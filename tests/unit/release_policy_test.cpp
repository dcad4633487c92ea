// Unit tests of when the held program is released (ckpt/src/copy/release_policy.hpp).
#include <catch2/catch.hpp>

#include "copy/release_policy.hpp"

using vmmckpt::ckpt::plan_release;
using vmmckpt::ckpt::release_plan;

TEST_CASE("release: everything in the snapshot: before the first copy to the host", "[release_policy]") {
  const release_plan p = plan_release(true, 0, 5);
  CHECK(p.before_chunk == 0);
  CHECK(p.from_snapshot());
}

TEST_CASE("release: the last chunks in the snapshot: once the chunks before them are copied", "[release_policy]") {
  const release_plan p = plan_release(true, 3, 5);
  CHECK(p.before_chunk == 3);
  CHECK(p.from_snapshot());
}

TEST_CASE("release: no snapshot: once every copy is done", "[release_policy]") {
  CHECK(plan_release(false, 5, 5).before_chunk == release_plan::after_copies);
  CHECK_FALSE(plan_release(false, 5, 5).from_snapshot());
  CHECK(plan_release(false, 0, 0).before_chunk == release_plan::after_copies);
  // Nothing in a snapshot that exists (it held no chunk and was given back): after the copies.
  CHECK(plan_release(true, 5, 5).before_chunk == release_plan::after_copies);
}

TEST_CASE("release: without a snapshot, trailing chunks that need no copy release before them", "[release_policy]") {
  // An incremental dump whose snapshot could not be made counts its last unchanged chunks (no bytes to copy)
  // as fitting in it: the program is released once the chunks before them are copied, as before the split.
  CHECK(plan_release(false, 3, 5).before_chunk == 3);
  // All of them unchanged and no snapshot: after the copies (there are none).
  CHECK(plan_release(false, 0, 5).before_chunk == release_plan::after_copies);
}
