// Runs a program for an end-to-end test and captures what it printed and how it ended.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace vmmckpt::test {

struct process_result {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string out;
  std::string err;
};

// Runs argv with the current environment plus `env` (an empty value unsets the
// variable). Kills the program after timeout_s.
process_result run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                           int timeout_s = 60);

}  // namespace vmmckpt::test
