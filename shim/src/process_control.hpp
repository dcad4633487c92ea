// What cuda-ckpt asks of this process, apart from the channel itself: describe it, check its pools, hold it, suspend, resume.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "vmmckpt/control_messages.hpp"

namespace vmmckpt::detail {

// hello: the process, its devices and its pools.
control::hello_reply describe_process();
// check: every pool's placement and physical memory agree.
control::check_reply check_pools();

// dump_begin: holds the program for a dump or a suspend (the gate closed, work in flight drained,
// every pool's device synchronized) and exports every pool segment's physical memory, one
// descriptor each in `fds` (the caller closes them). A failure_reply when it cannot; the program
// is then not held.
std::variant<control::dump_begin_reply, control::failure_reply> hold(std::chrono::steady_clock::time_point deadline,
                                                                     std::vector<int>& fds);
// Ends a hold: the gate opens and the program goes on. Returns how long it was held, in microseconds.
std::uint64_t release(const char* why);
// suspend, during a hold: every pool's physical memory given back; the program stays held until resume.
control::suspend_reply suspend_held(const std::string& image);
// resume: the pools' memory back from the suspend image, and the program goes on. A failure_reply
// when it cannot; the program then stays suspended with its image.
std::variant<control::resume_reply, control::failure_reply> resume();
bool is_suspended();

}  // namespace vmmckpt::detail
