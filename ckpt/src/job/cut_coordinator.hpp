// The cut of a job from the tool's side (docs/job-checkpoint.md): a connection to each rank, which arms it, and
// targets aimed at the ranks until every one stands at the same point of the job. The ranks stay armed, their
// NCCL calls waiting, until release(): across the holds that follow.
#pragma once

#include <sys/types.h>

#include <memory>
#include <vector>

#include "job/rendezvous.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/job.hpp"

namespace vmmckpt::ckpt {

class cut_coordinator {
 public:
  using clock = control_client::clock;
  // Connects to every rank and arms it until `until` (the whole operation's deadline: a crashed tool's ranks go on
  // by then).
  cut_coordinator(const std::vector<pid_t>& ranks, deadline until);
  // The same over connections made already: ranks of other nodes, reached through their node's agent.
  cut_coordinator(std::vector<std::unique_ptr<control_client>> ranks, deadline until);
  ~cut_coordinator();
  cut_coordinator(const cut_coordinator&) = delete;
  cut_coordinator& operator=(const cut_coordinator&) = delete;

  // Aims the targets until every rank stands at them, by `until`. Throws tool_error naming each rank that did
  // not get there and where it was (every rank is then released), or when a rank goes away.
  cut_figures bring_to_cut(deadline until);
  // Every rank's NCCL calls go on (the connections close).
  void release() noexcept;

 private:
  struct rank;
  static std::vector<std::unique_ptr<control_client>> connect(const std::vector<pid_t>& ranks, deadline until);
  // "process PID", with its node when it is on another.
  static std::string name_of(const rank& r);
  using targets_of_ranks = std::vector<std::vector<control::comm_count>>;
  bool aim(rank& r, const std::vector<control::comm_count>& targets, bool freeze);
  // Aims every rank at its targets; true when any was sent new ones.
  bool aim_all(const targets_of_ranks& targets, bool freeze);
  // Every rank has answered its targets and stands at them.
  bool all_at_cut(const targets_of_ranks& targets) const;
  bool all_answered() const;
  // The deadline passed: says which ranks were not at their targets, and where they were.
  [[noreturn]] void fail_not_there(const targets_of_ranks& targets);
  // Reads every status a rank has sent so far; false when none came within wait_ms. A rank whose connection ends
  // fails the cut, unless `until` has passed: its arming lapsed with it, and the deadline is what is reported.
  bool read_statuses(int wait_ms, deadline until);
  [[noreturn]] void fail(const std::string& why);

  std::vector<std::unique_ptr<rank>> ranks_;
};

// The cut of a job's dump or suspend: made by the last of the rank threads to meet at `prepared`, once every rank
// is prepared and just before their holds; its figures go into `figures`. `coordinator` holds the ranks at the cut
// until released.
struct job_cut {
  job_cut(const std::vector<pid_t>& ranks, deadline until, cut_figures& figures)
      : prepared(ranks.size(), [this, &ranks, until, &figures] {
          coordinator = std::make_unique<cut_coordinator>(ranks, until);
          figures = coordinator->bring_to_cut(until);
        }) {}
  job_cut(const job_cut&) = delete;
  job_cut& operator=(const job_cut&) = delete;

  rendezvous prepared;
  std::unique_ptr<cut_coordinator> coordinator;
};

}  // namespace vmmckpt::ckpt
