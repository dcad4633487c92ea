// `cuda-ckpt ps`: the processes running under the shim with their state and pool figures, and the images of processes that died.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_options.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "output.hpp"
#include "vmmckpt/ckpt/control_client.hpp"
#include "vmmckpt/ckpt/leftovers.hpp"
#include "vmmckpt/ckpt/process_recovery.hpp"
#include "vmmckpt/ckpt/processes.hpp"
#include "vmmckpt/ckpt/errors.hpp"
#include "vmmckpt/ckpt/job_image.hpp"
#include "vmmckpt/ckpt/suspend.hpp"

namespace vmmckpt::tools {

// Its states and where it looks, for `ps --help`.
const char* const ps_help_footer =
    "Finds every process with libvmmckpt.so in /proc/PID/maps or its control socket @vmmckpt/PID in\n"
    "/proc/net/unix (root: every user's), whatever its XDG_RUNTIME_DIR, and asks them all at once; one\n"
    "that does not answer within a second is listed as such.\n"
    "STATE (like cuda-checkpoint --get-state, with more detail):\n"
    "  running            the program runs\n"
    "  dumping            held for a dump: its GPU work waits until its memory is copied (cuda-checkpoint: locked)\n"
    "  suspending         held for a suspend, or its memory being freed (locked)\n"
    "  suspended          its GPU memory is in an image and freed; resume gives it back (checkpointed)\n"
    "  resuming           its memory is coming back from the image (locked)\n"
    "  paused             it gave its GPU memory back itself (vmmckpt_pause) and resumes itself\n"
    "  not responding     it took no connection or sent no answer within a second (stopped, frozen, swamped)\n"
    "  unreachable        libvmmckpt.so is loaded but its control server cannot be reached (the reason follows)\n"
    "  no control server  libvmmckpt.so is loaded but no server listens (no CUDA call yet, or a fork() child):\n"
    "                     counted on the last line; listed by `ps PID` and --json\n"
    "  orphaned           an image whose process died: its size and the `cuda-ckpt gc` that removes it follow\n"
    "  interrupted        a whole-process dump or restore whose tool died midway: what it left, and the one way\n"
    "                     back (`cuda-ckpt resume PID` while its process lives, `cuda-ckpt restore DIR` once its\n"
    "                     image is all there is) follow\n"
    "Socket files nobody listens at any more are removed (sockets only).\n"
    "--json: one object per entry with the same keys for all: pid, uid (the owner), status (the STATE\n"
    "above), state (running, suspended or paused as the process says; else the status), command, devices,\n"
    "pools, not_owned, nccl_bytes (of the owned bytes, NCCL's) when it answered; activity when it answered;\n"
    "resume_with (the command that resumes it, its job's for a rank suspended by\n"
    "`suspend --job`) when suspended; problem when it did not; image, image_bytes, why and remove_with when orphaned; "
    "operation (dump or\n"
    "restore), outcome (resume, restore or ended), image, why and way_back when interrupted.";

namespace {

std::string user_name(uid_t uid) {
  if (const passwd* pw = ::getpwuid(uid)) return pw->pw_name;
  return std::to_string(uid);
}


// The same keys for every entry, so that a script reading one kind reads them all.
nlohmann::json blank_entry(pid_t pid, const std::string& status) {
  return {{"pid", pid},
          {"command", nlohmann::json::array()},
          {"state", status},
          {"status", status},
          {"devices", nlohmann::json::array()},
          {"pools", nlohmann::json::array()},
          {"not_owned", nlohmann::json::array()}};
}

nlohmann::json entry_json(const ckpt::process_entry& p) {
  nlohmann::json entry;
  if (p.hello) {
    // The process's hello, as it sent it, less the reply's "ok".
    entry = nlohmann::json::parse(control::encode(*p.hello));
    entry.erase("ok");
    entry["status"] = p.status;
    entry["pid"] = p.pid;  // as this tool sees it: the program's own getpid() differs in another pid namespace
    if (p.hello->state == control::process_state::suspended)
      entry["resume_with"] =
          ckpt::job_resume_command(p.hello->image).value_or("cuda-ckpt resume " + std::to_string(p.pid));
  } else {
    entry = blank_entry(p.pid, p.status);
    entry["command"] = p.command;
    entry["problem"] = p.problem;
  }
  entry["uid"] = p.uid;
  return entry;
}

// Whose an image is: its directory's owner.
uid_t owner_of(const std::filesystem::path& image) {
  struct stat st {};
  return ::stat(image.c_str(), &st) == 0 ? st.st_uid : ::geteuid();
}

nlohmann::json orphan_json(const ckpt::orphaned_image& o) {
  nlohmann::json entry = blank_entry(o.pid, "orphaned");
  entry["uid"] = owner_of(o.path);
  entry["image"] = o.path.string();
  entry["image_bytes"] = o.bytes;
  entry["why"] = o.why;
  entry["remove_with"] = ckpt::gc_command_for(o.path.parent_path());
  return entry;
}

constexpr const char* row_format = "%-8s %-8s %-15s %-8s %12s %12s %12s  %s\n";

void print_process(const ckpt::process_entry& p) {
  const std::string pid = std::to_string(p.pid);
  if (!p.hello) {
    std::printf(row_format, pid.c_str(), user_name(p.uid).c_str(), p.status.c_str(), "-", "-", "-", "-",
                shown_command(p.command).c_str());
    std::printf("%-8s %s\n", "", shown(p.problem).c_str());
    return;
  }
  const control::hello_reply& h = *p.hello;
  std::uint64_t live = 0, backed = 0, not_owned = 0;
  std::string devices;
  for (const auto& d : h.devices) devices += (devices.empty() ? "" : ",") + std::to_string(d.ordinal);
  for (const auto& pool : h.pools) {
    live += pool.live_bytes;
    backed += pool.backed_bytes;
  }
  for (const auto& m : h.not_owned) not_owned += m.bytes;
  std::printf(row_format, pid.c_str(), user_name(p.uid).c_str(), p.status.c_str(),
              devices.empty() ? "-" : devices.c_str(), human_bytes(live).c_str(), human_bytes(backed).c_str(),
              human_bytes(not_owned).c_str(), shown_command(h.command).c_str());
  if (!h.not_owned.empty()) std::printf("%-8s not owned: %s\n", "", shown(kinds_and_sizes(h.not_owned)).c_str());
  if (h.nccl_bytes != 0) std::printf("%-8s NCCL: %s of it\n", "", human_bytes(h.nccl_bytes).c_str());
  if (h.state != control::process_state::suspended) return;
  if (const auto whole_job = ckpt::job_resume_command(h.image))
    std::printf("%-8s image %s, a rank of a job suspended by `suspend --job`; `%s` gives the job's GPU memory back\n",
                "", shown(h.image).c_str(), whole_job->c_str());
  else
    std::printf("%-8s image %s; `cuda-ckpt resume %d` gives its GPU memory back\n", "", shown(h.image).c_str(),
                static_cast<int>(p.pid));
}

// A whole-process dump or restore whose tool died, as ps shows it: what is left and the way back; nothing
// for one under way or one whose processes run on.
struct interrupted_entry {
  ckpt::process_transaction t;
  ckpt::transaction_outcome outcome;
};

const char* outcome_name(ckpt::transaction_outcome::kind k) {
  using kind = ckpt::transaction_outcome::kind;
  return k == kind::resume ? "resume" : k == kind::restore ? "restore" : "ended";
}

std::vector<interrupted_entry> interrupted_transactions(pid_t only, const std::vector<ckpt::process_entry>& known) {
  // What ps learnt of each process already answers whether it is suspended (one that did not answer may be);
  // `ps` lists every process under the shim, so one it did not list is not suspended by it. `ps PID` asks.
  auto suspended = [&](pid_t pid) {
    for (const auto& p : known)
      if (p.pid == pid) return !p.hello || ckpt::waits_for_resume(*p.hello);
    return only != 0 && ckpt::asks_suspended(pid);
  };
  std::vector<interrupted_entry> out;
  for (auto& t : ckpt::list_transactions()) {
    bool concerns = only == 0 || t.root_pid == only;
    for (const auto& [pid, start] : t.processes) concerns = concerns || pid == only;
    if (!concerns) continue;
    auto outcome = ckpt::assess(t, suspended);
    using kind = ckpt::transaction_outcome::kind;
    if (outcome.what == kind::under_way || outcome.what == kind::runs_on) continue;
    out.push_back({std::move(t), std::move(outcome)});
  }
  return out;
}

std::string operation_words(const ckpt::process_transaction& t) {
  return t.op == ckpt::process_transaction::kind::dump
             ? "whole-process dump of process " + std::to_string(t.root_pid) + " into " + t.image.string()
             : "whole-process restore of " + t.image.string();
}

nlohmann::json interrupted_json(const interrupted_entry& e) {
  nlohmann::json entry = blank_entry(e.t.root_pid, "interrupted");
  entry["uid"] = owner_of(e.t.record);
  entry["operation"] = e.t.op == ckpt::process_transaction::kind::dump ? "dump" : "restore";
  entry["outcome"] = outcome_name(e.outcome.what);
  entry["image"] = e.t.image.string();
  entry["why"] = operation_words(e.t) + ", stopped midway (its tool, process " + std::to_string(e.t.tool_pid) +
                 ", is gone): " + e.outcome.words;
  entry["way_back"] = e.outcome.command;
  return entry;
}

void print_interrupted(const interrupted_entry& e) {
  std::printf(row_format, std::to_string(e.t.root_pid).c_str(), user_name(owner_of(e.t.record)).c_str(), "interrupted",
              "-", "-", "-", "-", "-");
  std::printf("%-8s %s, stopped midway (its tool, process %d, is gone): %s\n", "", shown(operation_words(e.t)).c_str(),
              static_cast<int>(e.t.tool_pid), shown(e.outcome.words).c_str());
  if (e.outcome.command.empty())
    std::printf("%-8s no way back from this operation: an earlier complete image of the program is its way back\n", "");
  else
    std::printf("%-8s way back: %s\n", "", shown(e.outcome.command).c_str());
}

void print_orphan(const ckpt::orphaned_image& o) {
  std::printf(row_format, o.pid > 0 ? std::to_string(o.pid).c_str() : "-", user_name(owner_of(o.path)).c_str(),
              "orphaned", "-", "-", "-", "-", "-");
  std::printf("%-8s image %s (%s): %s; `%s` removes it\n", "", shown(o.path.string()).c_str(),
              human_bytes(o.bytes).c_str(), shown(o.why).c_str(),
              shown(ckpt::gc_command_for(o.path.parent_path())).c_str());
}

// What ps lists: the processes under vmmckpt, the images of those that died, and the whole-process operations
// stopped midway.
struct ps_listing {
  std::vector<ckpt::process_entry> processes;
  std::vector<ckpt::orphaned_image> orphans;
  std::vector<interrupted_entry> interrupted;
  bool empty() const { return processes.empty() && orphans.empty() && interrupted.empty(); }
};

// The listing of every process (only == 0) or of one.
ps_listing list_everything(pid_t only) {
  // Sockets nobody listens at any more go first (only sockets: gc's rule).
  ckpt::leftovers_report swept;
  ckpt::remove_stale_sockets(false, swept);
  ps_listing l;
  for (auto& o : ckpt::find_orphaned_images(ckpt::suspend_dirs_of_all_users()))
    if (only == 0 || o.pid == only) l.orphans.push_back(std::move(o));
  std::string not_listed;
  try {
    l.processes = ckpt::list_processes(only);
  } catch (const ckpt::tool_error& e) {
    not_listed = e.what();  // `ps PID` of a process that died: its orphaned images, or its dump, may answer
  }
  l.interrupted = interrupted_transactions(only, l.processes);
  if (!not_listed.empty() && l.orphans.empty() && l.interrupted.empty()) throw ckpt::tool_error(not_listed);
  return l;
}

void print_json(const ps_listing& l) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : l.processes) out.push_back(entry_json(p));
  for (const auto& o : l.orphans) out.push_back(orphan_json(o));
  for (const auto& e : l.interrupted) out.push_back(interrupted_json(e));
  std::cout << out.dump(2) << "\n";
}

void print_table(const ps_listing& l, pid_t only) {
  // LIVE: the pools' live bytes and the program's own VMM mappings, which vmmckpt owns; NOT OWNED: device
  // memory no image would hold.
  std::printf(row_format, "PID", "USER", "STATE", "DEVICES", "LIVE", "RESERVED", "NOT OWNED", "COMMAND");
  std::size_t without_server = 0;
  std::string without_server_pids;
  for (const auto& p : l.processes) {
    // The shim's children that never made a CUDA call (a shell, a fork): listed only when asked for.
    if (only == 0 && p.status == "no control server") {
      ++without_server;
      without_server_pids += (without_server_pids.empty() ? "" : " ") + std::to_string(p.pid);
      continue;
    }
    print_process(p);
  }
  for (const auto& o : l.orphans) print_orphan(o);
  for (const auto& e : l.interrupted) print_interrupted(e);
  if (without_server > 0)
    std::printf("%zu more with %s loaded but no control server (no CUDA call yet, or a fork() child): %s\n",
                without_server, std::string(ckpt::shim_file_name).c_str(), without_server_pids.c_str());
}

}  // namespace

int ps_command(pid_t only, bool as_json) {
  const ps_listing listing = list_everything(only);
  if (as_json) {
    print_json(listing);
  } else if (listing.empty()) {
    std::printf("no process under vmmckpt (looked at %s) and no orphaned image in %s\n",
                ckpt::where_processes_are_looked_for().c_str(),
                ::geteuid() == 0 ? "/dev/shm/vmmckpt-*" : ckpt::suspend_dir_of(::geteuid()).c_str());
  } else {
    print_table(listing, only);
  }
  return exit_ok;
}

subcommand add_ps(CLI::App& app) {
  struct options {
    pid_t pid = 0;
    bool json = false;
  };
  auto o = std::make_shared<options>();
  auto* command =
      app.add_subcommand("ps", "List the processes running under vmmckpt, and images of processes that died");
  command->add_option("pid,-t,--pid", o->pid, "Only this process (an error says why when it is not under vmmckpt)")
      ->check(process_id)
      ->type_name("PID");
  command->add_flag("--json", o->json, "Print JSON");
  command->footer(ps_help_footer);

  return {command, [o] { return ps_command(o->pid, o->json); }};
}

}  // namespace vmmckpt::tools
