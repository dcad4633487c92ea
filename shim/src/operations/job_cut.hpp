// The cut of a multi-rank job (docs/job-checkpoint.md): the NCCL operations this process issued, counted per
// communicator, and the wait that holds its threads at one point of the job while cuda-ckpt brings every rank
// there. The NCCL entry points (entry/nccl_entry_points.cpp) report each call here; the control server arms,
// aims and releases the cut (operations.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"

namespace vmmckpt::detail::job_cut {

// ---- what the NCCL entry points report
// A communicator's identity across the job: the same on every rank that belongs to it.
std::uint64_t id_of_unique_ids(const void* ids, std::size_t bytes) noexcept;
std::uint64_t id_of_split(void* parent, int color, const char* how) noexcept;  // the next split of `parent`
std::uint64_t id_of_local(void* comm) noexcept;  // a communicator known to this process alone

// One NCCL call that issues work, from its cut point to its return. Outside a group the constructor is the cut
// point: it waits while the cut holds the process, then counts the call. Inside a group the call is counted
// when the outermost group ends (group_scope), its cut point being the group's start.
class operation {
 public:
  enum class kind { collective, send, recv };
  operation(const char* name, void* comm, kind k, int peer = -1) noexcept;
  ~operation();
  operation(const operation&) = delete;
  operation& operator=(const operation&) = delete;

 private:
  bool counted_outside_group_ = false;
};

// A communicator being made: the call counts as its first operation (on `parent` too, for a split). It is no
// cut point (its other members may wait inside theirs already), but it is in flight until it returns. bind() names the handle, and its rank and size (a split's are known only then), once
// the call returned it; until then the cut does not report it.
class creation {
 public:
  creation(const char* name, std::uint64_t id, int rank, int size, void* parent = nullptr) noexcept;
  ~creation();
  void bind(void* comm, int rank, int size) noexcept;
  creation(const creation&) = delete;
  creation& operator=(const creation&) = delete;

 private:
  std::uint64_t id_;
  int rank_;
  bool counted_outside_group_ = false;
};

// ncclGroupStart to ncclGroupEnd: the outermost start is a cut point, and the group's operations count when
// its outermost end is called.
void group_start(const char* name) noexcept;
void group_end(bool issued = true) noexcept;  // before the real ncclGroupEnd (ncclGroupSimulateEnd: not issued)
void group_returned() noexcept;               // after it

// ---- what cuda-ckpt asks (operations.cpp)
// Arms the cut until `deadline`, for one connection: the session it is known by, 0 when another connection has it
// armed. Disarming a session that is no longer the one armed does nothing.
std::uint64_t arm(std::chrono::steady_clock::time_point deadline) noexcept;
// `freeze`: making a communicator waits too while the process stands at its targets.
void set_targets(const std::vector<control::comm_count>& targets, bool freeze = false) noexcept;
void disarm(std::uint64_t session) noexcept;
bool armed() noexcept;
// The state now, and a number that changes whenever it does.
control::cut_status status();
std::uint64_t generation() noexcept;

// A job's rank suspended (or resumed): its threads stay at their NCCL calls until it runs again, armed or not.
void hold_while_suspended(bool hold) noexcept;

}  // namespace vmmckpt::detail::job_cut
