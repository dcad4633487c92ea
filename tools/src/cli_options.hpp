// The command-line pieces several subcommands share: a process id, whole seconds, the process and image
// arguments in both spellings (ours, and CRIU's and cuda-checkpoint's).
#pragma once

#include <sys/types.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "vmmckpt/ckpt/deadlines.hpp"

namespace vmmckpt::tools {

// A positive integer (a negative one is a usage error, not a missing process).
extern const CLI::Validator process_id;

// --deadline: the hold's deadline in whole seconds from 1 to 3600 ("1.5" is refused as not a whole number,
// not as out of range), into `hold_deadline` (its default shown in the help).
CLI::Option* add_hold_deadline(CLI::App* command, std::chrono::seconds& hold_deadline, const std::string& help);

// The process of dump, suspend, resume and check: a positional, or -t/--pid as CRIU and NVIDIA's
// cuda-checkpoint spell it; one of the two, each listed once in the help. Not needed when `instead` was given
// (a job's --ranks, or dump's --nodes).
void add_pid(CLI::App* command, pid_t& pid, const std::string& what,
             const std::vector<const CLI::Option*>& instead = {});

// A whole job (docs/job-checkpoint.md): --job, the process being its launcher (or any process of it: its tree is
// the job), or --ranks naming its processes.
struct job_command_options {
  bool job = false;
  std::vector<pid_t> ranks;
  bool whole_job() const { return job || !ranks.empty(); }
};
// Registers --job and --ranks; returns --ranks, which stands for the process argument.
const CLI::Option* add_job(CLI::App* command, job_command_options& o, const std::string& what);

// What every command that holds a program and writes its image takes (dump, suspend).
struct held_image_options : job_command_options {
  pid_t pid = 0;
  std::string output;  // empty: the command's default place
  bool json = false;
  std::chrono::seconds hold_deadline{ckpt::default_dump_hold};
  // dump only: a job across nodes, through each node's agent (docs/job-checkpoint.md, "Across nodes").
  std::vector<std::string> nodes;
  std::string token_file;
};

// Registers the process, -o/--output/-D DIR, --json and --deadline, each with its command's words (and for dump,
// --nodes and --token-file).
void add_held_image(CLI::App* command, held_image_options& o, const std::string& output_help,
                    const std::string& deadline_help);

// An image directory read by inspect, verify, cat, merge, rm and restore: a positional, or -D DIR.
CLI::Option* add_image(CLI::App* command, std::string& path);

}  // namespace vmmckpt::tools
