// What cuda-ckpt asks of this process, apart from the channel itself: describe it, check its pools, hold it, suspend, resume.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "vmmckpt/protocol/control_messages.hpp"
#include "vmmckpt/restore/upload.hpp"

namespace vmmckpt::detail {

// A device as hello and dumps describe it: name, UUID, compute capability (what the driver says).
device_description describe_device(int ordinal);
// hello: the process, its devices and its pools.
control::hello_reply describe_process();
// check: every pool's placement and physical memory agree.
control::check_reply check_pools();

// hello with prepare_hold: lists the pools' allocations and makes their table now, while the program
// runs, for the hold that follows (used only if no block is allocated or freed in between).
void prepare_hold() noexcept;
// dump_begin: holds the program for a dump or a suspend (the gate closed, work in flight drained,
// every pool's device synchronized) and exports every pool segment's physical memory, one
// descriptor each in `fds` (the caller closes them). A failure_reply when it cannot; the program
// is then not held.
std::variant<control::dump_begin_reply, control::failure_reply> hold(std::chrono::steady_clock::time_point deadline,
                                                                     std::vector<int>& fds);
// Ends a hold: the gate opens and the program goes on. Returns how long it was held, in microseconds.
std::uint64_t release(const char* why);
// suspend, during a hold: unless the request expired, or its claim was withdrawn (suspend_claim.hpp),
// every pool's physical memory given back; the program then stays held until resume. A
// failure_reply (the program is then released and goes on) otherwise.
std::variant<control::suspend_reply, control::failure_reply> suspend_held(const control::suspend_request& request);
// resume: the pools' memory back from the suspend image (the very image suspend took: the same
// directory and image_id), and the program goes on. A failure_reply when it cannot; the program then
// stays suspended with its image. `progress` hears of the bytes loaded as they load.
std::variant<control::resume_reply, control::failure_reply> resume(const control::resume_request& request,
                                                                   const restore::upload_progress& progress = {});
bool is_suspended();

}  // namespace vmmckpt::detail
