// Human-readable sizes, rates and a progress bar for cuda-ckpt's terminal output.
#include "output.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>

#include "exit_codes.hpp"
#include "vmmckpt/support/json_fields.hpp"

namespace vmmckpt::tools {

std::string shown(std::string_view text) { return json_fields::printable(text); }

std::string shown_command(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + shown(w);
  return out;
}

std::string time_stamp() {
  char stamp[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  return stamp;
}

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return buf;
}

progress_line::progress_line(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled && ::isatty(STDERR_FILENO) == 1) {}

void progress_line::draw(const std::string& text) {
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void progress_line::show(const ckpt::copy_progress& p) {
  using stage = ckpt::copy_progress::stage;
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const bool new_stage = !drawn_ || p.at != stage_;
  if (new_stage) {
    // The rate counts this stage's bytes only: the writing goes on from what was written while held.
    stage_start_ = now;
    stage_start_bytes_ = p.bytes_done;
  }
  stage_ = p.at;
  if (p.at == stage::holding) {
    draw(label_ + ": waiting for the program's GPU work to drain, to hold it");
    return;
  }
  if (p.at == stage::released) {
    char line[160];
    std::snprintf(line, sizeof line, ": program released after %.2f s held%s%s\n", p.held_s,
                  p.bytes_done != 0 ? ", its bytes in host memory: " : "",
                  p.bytes_done != 0 ? human_bytes(p.bytes_done).c_str() : "");
    draw(label_ + line);
    drawn_ = false;  // that line stays
    return;
  }
  if (!new_stage && p.bytes_done < p.bytes_total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double seconds = std::chrono::duration<double>(now - stage_start_).count();
  const std::uint64_t moved = p.bytes_done - std::min(p.bytes_done, stage_start_bytes_);
  const double rate = seconds > 0.001 && moved > 0 ? static_cast<double>(moved) / seconds : 0;
  const double fraction = p.bytes_total ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1.0;
  constexpr int width = 24;
  std::string bar(static_cast<std::size_t>(std::min(fraction, 1.0) * width), '#');
  bar.resize(width, ' ');
  const char* what = p.at == stage::copying ? "copying, program held" : p.at == stage::loading ? "loading" : "writing";
  // Until a rate is known (the stage's first event), it and the time left show as dashes.
  char rate_text[48] = " --.-- GB/s  -:-- left";
  if (rate > 0) {
    const int left =
        static_cast<int>(static_cast<double>(p.bytes_total - std::min(p.bytes_done, p.bytes_total)) / rate);
    std::snprintf(rate_text, sizeof rate_text, " %.2f GB/s  %d:%02d left", rate / 1e9, left / 60, left % 60);
  }
  char line[256];
  std::snprintf(line, sizeof line, ": %s [%s] %s / %s %s", what, bar.c_str(), human_bytes(p.bytes_done).c_str(),
                human_bytes(p.bytes_total).c_str(), rate_text);
  draw(label_ + line);
}

void progress_line::finish() {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  drawn_ = false;
}

int report_failure(const std::string& command, bool json, const std::string& message, int exit_code,
                   const char* cause) {
  if (json)
    std::cout << nlohmann::json{{"ok", false},
                                {"command", command},
                                {"error", message},
                                {"cause", cause},
                                {"exit_code", exit_code}}
                     .dump(2)
              << "\n";
  else
    std::cerr << "cuda-ckpt" << (command.empty() ? "" : " " + command) << ": " << message << "\n";
  return exit_code;
}

int report_defect(const std::string& image, bool json, const std::string& defect) {
  if (json)
    std::cout << nlohmann::json{{"image", image}, {"ok", false}, {"defect", defect}}.dump(2) << "\n";
  else
    std::fprintf(stderr, "%s: BAD: %s\n", image.c_str(), defect.c_str());
  return exit_failure;
}

nlohmann::json phases_json(const std::vector<std::pair<std::string, double>>& phases) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [step, at] : phases) out[step] = at;
  return out;
}

nlohmann::json timings_json(const ckpt::image_result& r) {
  nlohmann::json out;
  out["phases"] = phases_json(r.phases);
  out["threads"] = {{"writers", r.threads.writers},
                    {"waiting_s", r.threads.waiting},
                    {"hashing_s", r.threads.hashing},
                    {"writing_s", r.threads.writing},
                    {"copy_waiting_s", r.threads.copy_waiting}};
  out["checksums"] = {{"where", r.checksums}, {"seconds", r.checksum_seconds}, {"not_copied_bytes", r.uncopied_bytes}};
  if (!r.checksums_why.empty()) out["checksums"]["why_not_gpu"] = r.checksums_why;
  return out;
}

}  // namespace vmmckpt::tools
