// SIGINT and SIGTERM during dump and suspend: noted, so that the operation stops cleanly.
#pragma once

#include <atomic>

namespace vmmckpt::tools {

// From now on SIGINT and SIGTERM only set the returned flag to their number (the handler does
// nothing else: async-signal-safe); dump and suspend check it between chunks, then remove their
// unfinished image and release the program. A second signal of the same kind acts as usual
// (it ends the tool), for an operation stuck where it does not look.
const std::atomic<int>& catch_interrupts();

}  // namespace vmmckpt::tools
