// A job's members: the processes under the shim in its launcher's tree, or the ranks named.
#include <algorithm>
#include <future>

#include "vmmckpt/ckpt/job.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"

namespace vmmckpt::ckpt {
namespace {

std::string who(pid_t pid) {
  const std::string name = short_name_of(pid);
  return "process " + std::to_string(pid) + (name.empty() ? "" : " (" + name + ")");
}

// Each process under the shim among the ranks named, or in the launcher's tree, asked for its state at once.
std::vector<std::future<process_entry>> ask_candidates(const job_spec& job, std::chrono::milliseconds wait) {
  const bool named = !job.ranks.empty();
  if (!named && !process_exists(job.root)) throw tool_error("no process " + std::to_string(job.root));
  // Another user's tree reads as one without the shim (its maps are closed to us): said as what it is.
  if (!named) require_own_process(job.root);
  std::vector<pid_t> candidates = named ? job.ranks : process_tree(job.root);
  std::vector<std::future<process_entry>> asked;
  for (const pid_t pid : candidates) {
    if (!named && shim_in(pid) != shim_presence::loaded) continue;  // the launcher, a CPU-only helper
    asked.push_back(std::async(std::launch::async, [pid, wait] { return list_processes(pid, wait).front(); }));
  }
  return asked;
}

// Whether `e` is a member in `state`; throws for one that keeps the job from being checkpointed or resumed.
bool is_member(const process_entry& e, member_state state, bool named) {
  const bool suspended = state == member_state::suspended, any = state == member_state::any;
  if (!e.hello) {
    // Under the shim but without a control server (no CUDA call yet, a fork() child): nothing of it to cut.
    if (!named && e.status == "no control server") return false;
    throw tool_error(who(e.pid) + " is " + e.status + ": " + e.problem);
  }
  const bool is_suspended = e.hello->state == control::process_state::suspended;
  if (suspended && !is_suspended) return false;
  if (!any && !suspended && is_suspended)
    throw tool_error(who(e.pid) + " is suspended (image " + e.hello->image +
                     "): resume the job first (cuda-ckpt resume --job)");
  if (!any && e.hello->state == control::process_state::paused)
    throw tool_error(who(e.pid) + " has paused its own GPU memory (vmmckpt_pause): nothing to checkpoint until it "
                                  "resumes it");
  return true;
}

[[noreturn]] void throw_no_members(const job_spec& job, bool suspended) {
  throw tool_error(!job.ranks.empty()
                       ? std::string("none of the processes named is ") + (suspended ? "suspended" : "running")
                       : "no process in the tree of process " + std::to_string(job.root) + " runs under vmmckpt" +
                             (suspended ? " suspended" : " with CUDA in use") +
                             (suspended ? ": nothing of the job to resume" : ""));
}

}  // namespace

std::vector<pid_t> job_members(const job_spec& job, member_state state, std::chrono::milliseconds wait) {
  std::vector<std::future<process_entry>> asked = ask_candidates(job, wait);
  std::vector<pid_t> members;
  for (auto& f : asked) {
    const process_entry e = f.get();
    if (is_member(e, state, !job.ranks.empty())) members.push_back(e.pid);
  }
  std::sort(members.begin(), members.end());
  if (members.empty()) throw_no_members(job, state == member_state::suspended);
  return members;
}

}  // namespace vmmckpt::ckpt
