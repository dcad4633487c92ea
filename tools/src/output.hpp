// Human-readable sizes, rates and a progress bar for cuda-ckpt's terminal output.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "vmmckpt/ckpt/dump.hpp"

namespace vmmckpt::tools {

std::string human_bytes(std::uint64_t bytes);  // "1.50 GiB"

// "managed 64.00 MiB, arrays 1.00 MiB": memory by kind ({kind, bytes} entries: what a process does
// not own, or what a partial image lacks).
template <typename Entries>
std::string kinds_and_sizes(const Entries& entries) {
  std::string out;
  for (const auto& e : entries) out += (out.empty() ? "" : ", ") + e.kind + " " + human_bytes(e.bytes);
  return out;
}
// The same as a JSON array of {"kind", "bytes"}, the names the protocol and the manifest use.
template <typename Entries>
nlohmann::json kinds_and_sizes_json(const Entries& entries) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : entries) out.push_back({{"kind", e.kind}, {"bytes", e.bytes}});
  return out;
}

// A dump's or suspend's "phases" (when each step ended) and "threads" (where the threads' time
// went), for --json.
nlohmann::json timings_json(const ckpt::image_result& r);

// Draws "[####    ] 1.2/4.0 GiB  3.1 GB/s  0:02 left" on stderr, only when stderr
// is a terminal; redraws at most ten times a second.
class progress_bar {
 public:
  explicit progress_bar(std::string label);
  void update(std::uint64_t done, std::uint64_t total);
  void finish();

 private:
  std::string label_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace vmmckpt::tools
