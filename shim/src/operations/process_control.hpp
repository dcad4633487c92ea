// What cuda-ckpt asks of this process: describe it, check its pools, hold it, suspend it. (Resume is
// restore.hpp's; the sequence of each request and the state it leaves, operations.hpp's.)
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/support/host_pages.hpp"

namespace vmmckpt::detail {

// hello: the process, its devices and its pools.
control::hello_reply describe_process();
// check: every pool's placement and physical memory agree.
control::check_reply check_pools();

// Waits for the work on every pool's device, and on program-made VMM memory; the microseconds it took.
double synchronize_all();

// The pools' allocation table as a sealed memfd (dump_begin's, regions'); -1 with errno set when it cannot be made.
int allocation_table_memfd(const std::vector<control::pool_contents>& pools);

// hello with prepare_hold: lists the pools' allocations and makes their table now, while the program
// runs, for the hold that follows (used only if no block is allocated or freed in between).
void prepare_hold() noexcept;
// dump_begin: holds the program for a dump or a suspend (the gate closed, work in flight drained,
// every pool's device synchronized) and exports every pool segment's physical memory, one
// descriptor each in `fds` (the caller closes them). A failure_reply when it cannot; the program
// is then not held.
std::variant<control::dump_begin_reply, control::failure_reply> hold(
    std::chrono::steady_clock::time_point hold_deadline_at, std::vector<int>& fds);
// Ends a hold: the gate opens and the program goes on. Returns how long it was held, in microseconds.
std::uint64_t release(const char* why);
// suspend, during a hold: unless the request expired, or its claim was withdrawn (suspend_claim.hpp),
// every pool's physical memory given back; the program then stays held until resume. A
// failure_reply (the program is then released and goes on) otherwise. A rank of a job's suspend
// (docs/job-checkpoint.md) first gives back its mappings of the other ranks' memory, and its threads stay at
// their NCCL calls until the job resumes.
std::variant<control::suspend_reply, control::failure_reply> suspend_held(const control::suspend_request& request,
                                                                          bool job_rank = false);
// Sets aside what a suspended program's resume will need (host memory for its load buffers, address space for its
// threads), or says why it cannot: a suspend refuses then, a job's suspend before its hold.
std::string reserve_resume_room() noexcept;
// What a suspend recorded of its image, for the resume (restore.cpp): its directory, the image_id, and
// the directory's identity (a resume loads only from the very directory suspend wrote).
struct suspend_record {
  std::string image, image_id;
  dev_t dev = 0;
  ino_t ino = 0;
};
suspend_record suspended_image();
// Host memory set aside when a suspend is taken for the resume's load buffers, under the operation lock: a
// program whose address space is nearly full (ulimit -v) would otherwise be suspended for good. Given back by
// the resume that succeeds. Never destroyed at exit (threads may still run then).
host_pages& resume_buffers();


}  // namespace vmmckpt::detail
