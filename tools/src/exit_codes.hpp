// cuda-ckpt's documented exit codes (also in --help and the README).
#pragma once

namespace vmmckpt::tools {

enum exit_code : int {
  exit_ok = 0,
  exit_failure = 1,           // the operation failed; the message says why
  exit_usage = 2,             // bad command line
  exit_partial_refused = 3,   // dump, suspend: the program has memory vmmckpt does not own (--allow-partial)
  exit_cannot_execute = 126,  // run: the command exists but cannot be executed
  exit_not_found = 127,       // run: the command was not found
};

}  // namespace vmmckpt::tools
