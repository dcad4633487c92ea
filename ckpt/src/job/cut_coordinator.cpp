// The cut of a job from the tool's side: arm every rank, aim the targets, wait until every rank stands at them.
#include "job/cut_coordinator.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>

#include "job/cut_plan.hpp"
#include "vmmckpt/support/fault_point.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {

struct cut_coordinator::rank {
  pid_t pid = 0;
  std::unique_ptr<control_client> client;
  control::cut_status status;
  std::vector<control::comm_count> sent;  // the targets it was last given
  bool frozen = false;                    // and whether the cut was frozen with them
  bool answered = true;                   // its status answers the targets sent
};

std::vector<std::unique_ptr<control_client>> cut_coordinator::connect(const std::vector<pid_t>& ranks, deadline until) {
  std::vector<std::unique_ptr<control_client>> clients;
  clients.reserve(ranks.size());
  for (const pid_t pid : ranks) clients.push_back(std::make_unique<control_client>(pid, until));
  return clients;
}

std::string cut_coordinator::name_of(const rank& r) {
  const std::string& node = r.client->node();
  return "process " + std::to_string(r.pid) + (node.empty() ? "" : " on " + node);
}

cut_coordinator::cut_coordinator(const std::vector<pid_t>& ranks, deadline until)
    : cut_coordinator(connect(ranks, until), until) {}

cut_coordinator::cut_coordinator(std::vector<std::unique_ptr<control_client>> clients, deadline until) {
  // A second past the deadline: this tool, not a rank's lapsing arming, is the one to find the deadline passed
  // (and say which rank was not there). A tool that dies leaves them a second later.
  const auto armed_for = std::max(std::chrono::milliseconds(1), until.remaining()) + std::chrono::seconds(1);
  for (auto& client : clients) {
    auto r = std::make_unique<rank>();
    r->pid = client->pid();
    r->client = std::move(client);
    ranks_.push_back(std::move(r));
  }
  // Armed one after the other: a rank armed first waits at its next NCCL call, which only delays it.
  for (auto& r : ranks_) {
    try {
      r->status = r->client->cut_arm(armed_for);
    } catch (const control_error& e) {
      if (e.refused && e.refusal == control::refusal::unknown_op)
        fail(name_of(*r) + " runs a vmmckpt older than this cuda-ckpt: it knows no cut");
      fail(e.what());
    }
  }
  fault_point("job:armed");
}

cut_coordinator::~cut_coordinator() { release(); }

void cut_coordinator::release() noexcept {
  for (auto& r : ranks_) r->client.reset();
}

void cut_coordinator::fail(const std::string& why) {
  release();
  throw tool_error(why);
}

bool cut_coordinator::read_statuses(int wait_ms, deadline until) {
  std::vector<pollfd> fds;
  for (const auto& r : ranks_) fds.push_back({r->client->fd(), POLLIN, 0});
  if (::poll(fds.data(), fds.size(), wait_ms) <= 0) return false;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    if (fds[i].revents == 0) continue;
    rank& r = *ranks_[i];
    try {
      // Every status sent so far; the last is the rank's state now.
      while (auto status = r.client->next_cut_status(0)) {
        r.status = std::move(*status);
        r.answered = true;
      }
    } catch (const control_error& e) {
      if (until.expired()) return false;
      fail(name_of(r) + " left the job's cut: " + e.what() + "; every other rank goes on where it was");
    }
  }
  return true;
}

// Sends rank r its targets (and whether the cut is frozen) unless it has them already; true when it was sent.
bool cut_coordinator::aim(rank& r, const std::vector<control::comm_count>& targets, bool freeze) {
  if (targets == r.sent && freeze == r.frozen) return false;
  try {
    r.client->cut_targets(targets, freeze);
  } catch (const control_error& e) {
    fail(name_of(r) + " left the job's cut: " + e.what());
  }
  r.sent = targets;
  r.frozen = freeze;
  r.answered = false;
  return true;
}

bool cut_coordinator::aim_all(const targets_of_ranks& targets, bool freeze) {
  bool aimed = false;
  for (std::size_t i = 0; i < ranks_.size(); ++i) aimed = aim(*ranks_[i], targets[i], freeze) || aimed;
  return aimed;
}

bool cut_coordinator::all_at_cut(const targets_of_ranks& targets) const {
  bool there = true;
  for (std::size_t i = 0; i < ranks_.size(); ++i)
    there = there && ranks_[i]->answered && at_cut(ranks_[i]->status, targets[i]);
  return there;
}

bool cut_coordinator::all_answered() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const auto& r) { return r->answered; });
}

void cut_coordinator::fail_not_there(const targets_of_ranks& targets) {
  std::string behind;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    const rank& r = *ranks_[i];
    const std::string silent = r.answered || !r.client->node().empty() ? std::string() : why_silent(r.pid);
    if (!r.answered)  // its last status is older than its targets: it stopped answering
      behind += "\n  " + name_of(r) + ": has not answered its targets" +
                (silent.empty() ? " (its control thread does not run)" : ": " + silent);
    else if (!at_cut(r.status, targets[i]))
      behind += "\n  " + name_of(r) + ": " + against_targets(r.status, targets[i]);
  }
  fail("the job's ranks did not reach one point within the deadline (--deadline); every rank goes on as it "
       "was. Not there:" +
       behind);
}

cut_figures cut_coordinator::bring_to_cut(deadline until) {
  const auto start = clock::now();
  cut_figures figures;
  // Aimed until every rank stands at its targets; then frozen (making a communicator waits too), and the cut is
  // the ranks' answers to that, when they still stand there. One that moved meanwhile un-freezes it.
  bool freeze = false;
  for (;;) {
    std::vector<control::cut_status> statuses;
    for (const auto& r : ranks_) statuses.push_back(r->status);
    const auto targets = cut_targets(statuses);
    if (aim_all(targets, freeze)) ++figures.rounds;
    const bool there = all_at_cut(targets);
    if (there && freeze) break;
    if (there) {
      if (const std::string why = missing_members(statuses); !why.empty()) fail(why + "; every rank goes on");
      freeze = true;
      continue;
    }
    if (freeze && all_answered()) freeze = false;
    if (until.expired()) fail_not_there(targets);
    read_statuses(until.remaining_ms(1, 100), until);
  }
  figures.seconds = std::chrono::duration<double>(clock::now() - start).count();
  fault_point("job:cut");
  return figures;
}

}  // namespace vmmckpt::ckpt
