// When the held program may go on.
#include "copy/release_policy.hpp"

namespace vmmckpt::ckpt {

release_plan plan_release(bool snapshot_made, std::size_t first_in_snapshot, std::size_t chunks) {
  // Everything in the snapshot: once it is copied, before any copy to the host.
  if (snapshot_made && first_in_snapshot == 0) return {0};
  // The last chunks in the snapshot (or needing no copy at all): once the chunks before them are copied.
  if (first_in_snapshot > 0 && first_in_snapshot < chunks) return {first_in_snapshot};
  return {};
}

}  // namespace vmmckpt::ckpt
