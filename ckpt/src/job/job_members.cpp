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

}  // namespace

std::vector<pid_t> job_members(const job_spec& job, member_state state, std::chrono::milliseconds wait) {
  const bool suspended = state == member_state::suspended, any = state == member_state::any;
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
  std::vector<pid_t> members;
  for (auto& f : asked) {
    const process_entry e = f.get();
    if (!e.hello) {
      // Under the shim but without a control server (no CUDA call yet, a fork() child): nothing of it to cut.
      if (!named && e.status == "no control server") continue;
      throw tool_error(who(e.pid) + " is " + e.status + ": " + e.problem);
    }
    const bool is_suspended = e.hello->state == control::process_state::suspended;
    if (suspended && !is_suspended) continue;
    if (!any && !suspended && is_suspended)
      throw tool_error(who(e.pid) + " is suspended (image " + e.hello->image +
                       "): resume the job first (cuda-ckpt resume --job)");
    if (!any && e.hello->state == control::process_state::paused)
      throw tool_error(who(e.pid) + " has paused its own GPU memory (vmmckpt_pause): nothing to checkpoint until it "
                                    "resumes it");
    members.push_back(e.pid);
  }
  std::sort(members.begin(), members.end());
  if (members.empty())
    throw tool_error(named ? std::string("none of the processes named is ") + (suspended ? "suspended" : "running")
                           : "no process in the tree of process " + std::to_string(job.root) + " runs under vmmckpt" +
                                 (suspended ? " suspended" : " with CUDA in use") +
                                 (suspended ? ": nothing of the job to resume" : ""));
  return members;
}

}  // namespace vmmckpt::ckpt
