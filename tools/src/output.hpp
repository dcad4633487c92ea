// Human-readable sizes, rates and a progress bar for cuda-ckpt's terminal output.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vmmckpt/ckpt/dump.hpp"

namespace vmmckpt::tools {

std::string human_bytes(std::uint64_t bytes);  // "1.50 GiB"

// Text from another process or an image, as a terminal may show it: every byte outside printable ASCII
// written as \xNN, so that an escape sequence or a newline in a command line cannot clear the screen or
// forge a row. (--json output needs none of this: JSON escapes control characters itself.)
std::string shown(std::string_view text);
// A command line's words, each shown so, joined by spaces.
std::string shown_command(const std::vector<std::string>& words);

// The local time as default image names carry it: "20261125-014500".
std::string time_stamp();

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
// {"step": seconds from the start at which it ended, ...}: the phases --json prints.
// What inspect --json says of every job's image, on one node (job.json) or across nodes (job-nodes.json).
template <typename JobImage>
nlohmann::json job_image_json(const std::string& image, const JobImage& j) {
  return {{"image", image},
          {"job", true},
          {"kind", j.kind},
          {"created", j.created},
          {"host", j.host},
          {"tool_version", j.tool_version},
          {"cut_seconds", j.cut_seconds},
          {"cut_rounds", j.cut_rounds},
          {"held_ms", j.held_ms}};
}

nlohmann::json phases_json(const std::vector<std::pair<std::string, double>>& phases);
nlohmann::json timings_json(const ckpt::image_result& r);

// A long operation's progress on stderr, only when stderr is a terminal (and `enabled`: not with
// --json): one line redrawn in place at most ten times a second, "dump: copying, program held
// [####    ] 1.20 GiB / 4.00 GiB  3.10 GB/s  0:02 left", each draw clearing what the last left
// ("\r\033[K"). The program's release is a line of its own that stays. Safe from any thread.
class progress_line {
 public:
  explicit progress_line(std::string label, bool enabled = true);
  ~progress_line() { finish(); }
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  void show(const ckpt::copy_progress& p);
  // Clears the line, so that what is printed next starts on a clean one.
  void finish();
  // A callback for the engine that shows each event here.
  // None when nothing would be drawn: a resume then asks the program for no progress frames.
  ckpt::progress_callback callback() {
    if (!enabled_) return {};
    return [this](const ckpt::copy_progress& p) { show(p); };
  }

 private:
  void draw(const std::string& text);
  std::mutex mutex_;
  std::string label_;
  bool enabled_;
  ckpt::copy_progress::stage stage_ = ckpt::copy_progress::stage::holding;
  std::chrono::steady_clock::time_point stage_start_, last_draw_;
  std::uint64_t stage_start_bytes_ = 0;
  bool drawn_ = false;  // something is on the line
};

// A failed command's report: "cuda-ckpt COMMAND: MESSAGE" on stderr, or with --json the object
// {"ok": false, "command", "error", "exit_code"} on stdout. Returns exit_code.
// `cause` names the kind of failure in --json (docs/cli.md, "Exit status"): the Python API raises one class per cause.
int report_failure(const std::string& command, bool json, const std::string& message, int exit_code,
                   const char* cause = "failed");

// verify's report of a damaged image: "IMAGE: BAD: DEFECT" on stderr, or with --json
// {"image", "ok": false, "defect"} on stdout. Returns exit_failure.
int report_defect(const std::string& image, bool json, const std::string& defect);

}  // namespace vmmckpt::tools
