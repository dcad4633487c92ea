// What the tests of the collective job (tests/programs/emu/collective_job.cpp) read of it: where it is, and the
// results each rank prints at its end.
#pragma once

#include <map>
#include <sstream>
#include <string>

#include "e2e_support.hpp"

namespace vmmckpt::test {

inline const std::string job_program = programs + "emu_collective_job";

// Rank -> "STEPS HASH", from the `done RANK STEPS HASH` lines.
inline std::map<int, std::string> done_lines(const std::string& out) {
  std::map<int, std::string> done;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("done ", 0) != 0) continue;
    std::istringstream fields(line.substr(5));
    int rank = -1;
    std::string steps, hash;
    fields >> rank >> steps >> hash;
    done[rank] = steps + " " + hash;
  }
  return done;
}

}  // namespace vmmckpt::test
