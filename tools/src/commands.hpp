// cuda-ckpt's subcommands other than run; each returns the process exit code.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "cli_options.hpp"
#include "vmmckpt/ckpt/dump.hpp"
#include "vmmckpt/ckpt/deadlines.hpp"
#include "vmmckpt/image/image.hpp"

namespace CLI {
class App;
}

namespace vmmckpt::tools {

// A subcommand as its own file registers it: its flags and help on the application, and what runs it once
// the command line is parsed (returning the exit code).
struct subcommand {
  CLI::App* app;
  std::function<int()> run;
};
// Each registers one subcommand of the same name.
using add_subcommand = subcommand(CLI::App& app);
add_subcommand add_run, add_ps, add_check, add_dump, add_merge, add_rm, add_inspect, add_verify, add_cat, add_gc,
    add_suspend, add_resume, add_peek, add_poke;
// `trailing_command`: what followed "--" on the command line, filled in before the subcommand runs.
subcommand add_restore(CLI::App& app, const std::vector<std::string>& trailing_command);

int ps_command(pid_t only, bool json);  // only: 0 for every process
int check_command(pid_t pid, bool json);

inline constexpr int default_full_every = 8;

struct dump_command_options : held_image_options {  // output empty: ./vmmckpt-<pid>-<time>
  std::string chunk = "32M";
  std::string staging = "auto";
  std::string pinned = "auto";
  int streams = 2;
  int writers = 0;  // 0: ckpt::default_writers()
  bool no_gpu_snapshot = false;
  bool allow_partial = false;
  std::string parent;          // an incremental image: the image to compare with
  bool cpu_checksums = false;  // block checksums on the CPU even where the GPU can compute them
  bool process = false;        // the whole process, CPU side through CRIU (process_commands.cpp)
  bool leave_running = false;  // with process: it goes on afterwards
  bool pre_copy = false;       // with process: the GPU memory dumped first while it runs
  std::vector<std::string> criu_args;
  double every_s = 0;                   // > 0: a series of dumps, one every so many seconds
  int count = 0;                        // with every_s: this many dumps (0: until the process ends or a signal)
  int full_every = default_full_every;  // with every_s: a full image after this many incremental ones
};
int dump_command(const dump_command_options& options);
int dump_process_command(const dump_command_options& options);
int inspect_process_command(const std::string& image, bool json);
// The verify_*_command functions throw a defect found (image::image_error); verify_command reports it.
int verify_process_command(const std::string& image, bool json);
int restore_process_command(const std::string& image, bool json, bool verify_data, bool trust_owner,
                            const std::vector<std::string>& criu_args);

struct suspend_command_options : held_image_options {
  // output empty: /dev/shm/vmmckpt-<uid>/suspend-<pid>-<time>
  suspend_command_options() { hold_deadline = ckpt::default_suspend_hold; }
  int writers = 0;  // 0: ckpt::default_writers()
  bool verify = false;
  bool allow_partial = false;
  std::string parent;  // an incremental image: the image to compare with
  bool cpu_checksums = false;
};
int suspend_command(const suspend_command_options& options);
// resume_deadline: resume's --deadline (ckpt::default_resume_deadline unless given).
int resume_command(pid_t pid, bool json, std::chrono::seconds resume_deadline);
// A whole job (job_commands.cpp): --job PID or --ranks.
int dump_job_command(const dump_command_options& options, const ckpt::copy_settings& copy);
int suspend_job_command(const suspend_command_options& options, const ckpt::copy_settings& copy);
int resume_job_command(const job_command_options& job, pid_t pid, bool json, std::chrono::seconds resume_deadline);
int inspect_job_command(const std::string& image, bool json);
// A job across nodes (job_agent_command.cpp): dump --nodes, and the node's side, cuda-ckpt job-agent.
int dump_nodes_command(const dump_command_options& options, const ckpt::copy_settings& copy);
int inspect_job_nodes_command(const std::string& image, bool json);
int verify_job_nodes_command(const std::string& image, bool json);
add_subcommand add_job_agent;
int verify_job_command(const std::string& image, bool json);

int inspect_command(const std::string& image, bool json);
int gc_command(const std::vector<std::string>& dirs, bool dry_run, bool json);
struct restore_command_options {
  std::string image;
  bool replay = false;
  int device = -1;
  bool verify_first = true;
  bool json = false;                   // whole-process form only
  bool trust_owner = false;            // whole-process form only: as root, an image root does not own
  std::vector<std::string> criu_args;  // whole-process form only
};
// With a command: starts it with the image's GPU memory. Without: restores a whole-process image.
int restore_command(const restore_command_options& options, const std::vector<std::string>& command);
int verify_command(const std::string& image, bool json);
// Writes the image's bytes for [addr, addr + size) to `output` (empty: stdout); addr and size as typed.
// merge: the chain ending in `image` as one full image at `output`; rm: an image no sibling names as parent.
int merge_command(const std::string& image, const std::string& output, bool json);
int rm_command(const std::string& image, bool force, bool json);
// "IMAGE <- PARENT <- ...": the chain a reader follows; its length, the image included.
std::string chain_text(const image::reader& r);
std::size_t chain_length(const image::reader& r);
int cat_command(const std::string& image, const std::string& addr, const std::string& size, const std::string& output);

}  // namespace vmmckpt::tools
