// The cut's arithmetic (docs/job-checkpoint.md): from what each rank of a job says it issued on each NCCL
// communicator, what each must have issued for all of them to stand at one point, and whether they do. Pure.
#pragma once

#include <string>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::ckpt {

// Per rank, in the order given, the targets to send it: on each communicator it reports, the collectives the
// member furthest on has issued, and for each pair of members, the sends of one to the other or the receives of
// the other from it, whichever are more.
std::vector<std::vector<control::comm_count>> cut_targets(const std::vector<control::cut_status>& ranks);

// The rank stands at its targets: each of its counts is its target's, and no NCCL call of it is under way.
bool at_cut(const control::cut_status& rank, const std::vector<control::comm_count>& targets);

// A communicator some of whose ranks are no process of the job (their counts never come): why the job cannot be
// cut, in words; "" when every communicator's ranks are all there.
std::string missing_members(const std::vector<control::cut_status>& ranks);

// Where a rank stands against its targets, in words, for the message of a cut that did not complete:
// "waiting in ncclAllReduce; communicator 0x5c1e...: 17 of 18 collectives" or "not at an NCCL call (...)".
std::string against_targets(const control::cut_status& rank, const std::vector<control::comm_count>& targets);

}  // namespace vmmckpt::ckpt
