// Checkpoints of a whole multi-rank job (docs/job-checkpoint.md): every rank brought to one point of the job by
// the cut, then dumped, suspended or resumed together. The whole job through CRIU is process_checkpoint.hpp's.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "vmmckpt/ckpt/dump.hpp"
#include "vmmckpt/ckpt/suspend.hpp"
#include "vmmckpt/ckpt/deadlines.hpp"

namespace vmmckpt::ckpt {

// A job: its launcher (torchrun, mpirun, a Slurm step's shell), whose tree holds its ranks, or the ranks named.
struct job_spec {
  pid_t root = 0;
  std::vector<pid_t> ranks;  // when given: exactly these processes, root unused
};

// The job's processes under the shim with a control server (those that used CUDA), ascending: root's tree, or
// the ranks named (each must be one). `running`: all must run (a dump, a suspend); `suspended`: those suspended
// (a resume); `any`: all, whatever their state. Each must answer within `wait` (a stopped one never does: a dump's
// deadline bounds it). tool_error when there is none.
enum class member_state { running, suspended, any };
std::vector<pid_t> job_members(const job_spec& job, member_state state = member_state::running,
                               std::chrono::milliseconds wait = member_wait);

// Where the cut's time went: how long it took to bring every rank to one point, and how many times the tool
// aimed it (once when every rank was at the same point already).
struct cut_figures {
  double seconds = 0;
  int rounds = 0;
};

// What a whole job's dump and its suspend are both asked, and both answer.
struct job_copy_options {
  job_spec job;
  std::filesystem::path output;
  copy_settings copy;
  bool allow_partial = false;
};

struct job_copy_result {
  std::filesystem::path image;
  std::vector<pid_t> ranks;
  cut_figures cut;
  double seconds = 0;
};

// `output`: the job's image directory to create, job.json and one image per rank.
struct job_dump_options : job_copy_options {
  std::chrono::milliseconds hold_deadline{default_dump_hold};  // the cut and each rank's hold, as dump's --deadline
  bool gpu_snapshot = true;
};

struct job_dump_result : job_copy_result {
  std::vector<dump_result> dumps;  // one per rank, in the order of `ranks`
  double held_ms = 0;              // the longest any rank was held
};

// The cut, then every rank held and copied out as dump holds a program; the ranks are released together once
// every rank's bytes are safe, and go on. DIR appears only complete. Throws tool_error (a rank that did not reach
// the cut is named, with where it was), image::image_error or interrupted; every rank then goes on.
job_dump_result dump_job(const job_dump_options& options);

// `output`: the job's image directory (default: one in /dev/shm, removed by resume --job).
struct job_suspend_options : job_copy_options {
  std::chrono::milliseconds hold_deadline{default_suspend_hold};
  bool verify = false;
};

struct job_suspend_result : job_copy_result {
  std::vector<suspend_result> suspends;  // one per rank, in the order of `ranks`
  std::uint64_t freed_bytes = 0;
};

// The cut, then every rank's image written and checked; the job's claim is accepted only once all are, and every
// rank then gives its GPU memory back, the memory it maps of the other ranks first. All of them, or none: a rank
// whose tool goes away after the acceptance suspends itself. Throws as dump_job; no rank is then suspended.
job_suspend_result suspend_job(const job_suspend_options& options);

struct job_resume_result {
  std::vector<pid_t> ranks;
  std::vector<resume_result> resumes;  // one per rank, in the order of `ranks`
  std::uint64_t bytes = 0;
  double seconds = 0;
};

// Every suspended rank of the job loads its memory (still held), then each maps the others' memory again and goes
// on. A rank that cannot stays suspended, its memory loaded; resume_job again finishes what is left. `images`: the
// directory holding the ranks' images (IMAGES/PID), when not where their suspend wrote them (a whole job's image,
// moved or restored). Everything within `resume_deadline` from now (resume --job's --deadline;
// restore_resume_deadline for the resume that ends a whole job's dump or restore): past it, tool_error names the
// ranks it waits for that are stopped.
job_resume_result resume_job(const job_spec& job, const std::filesystem::path& images = {},
                             std::chrono::milliseconds resume_deadline = restore_resume_deadline);

}  // namespace vmmckpt::ckpt
