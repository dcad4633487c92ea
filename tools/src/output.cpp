// Human-readable sizes, rates and a progress bar for cuda-ckpt's terminal output.
#include "output.hpp"

#include <unistd.h>

#include <cstdio>

namespace vmmckpt::tools {

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

progress_bar::progress_bar(std::string label)
    : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()) {}

void progress_bar::update(std::uint64_t done, std::uint64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  const double fraction = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  constexpr int width = 30;
  std::string bar(static_cast<std::size_t>(fraction * width), '#');
  bar.resize(width, ' ');
  const double left = rate > 0 ? static_cast<double>(total - done) / rate : 0;
  std::fprintf(stderr, "\r%s [%s] %s / %s  %.2f GB/s  %d:%02d left ", label_.c_str(), bar.c_str(),
               human_bytes(done).c_str(), human_bytes(total).c_str(), rate / 1e9, static_cast<int>(left) / 60,
               static_cast<int>(left) % 60);
  std::fflush(stderr);
}

void progress_bar::finish() {
  if (enabled_ && drawn_) std::fprintf(stderr, "\n");
}

nlohmann::json timings_json(const ckpt::image_result& r) {
  nlohmann::json out;
  for (const auto& [step, at] : r.phases) out["phases"][step] = at;
  out["threads"] = {{"writers", r.threads.writers},
                    {"waiting_s", r.threads.waiting},
                    {"hashing_s", r.threads.hashing},
                    {"writing_s", r.threads.writing},
                    {"copy_waiting_s", r.threads.copy_waiting}};
  return out;
}

}  // namespace vmmckpt::tools
