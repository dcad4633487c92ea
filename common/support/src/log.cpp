// The in-process logger: one mutex around single-threaded spdlog sinks, created on first use.
#include "vmmckpt/support/log.hpp"

#include <spdlog/logger.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace vmmckpt::log {
namespace {

// One mutex serializes every spdlog call, so the _st sinks are safe and fork()
// can take the lock (spdlog's own locks could not be reached from atfork).
std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}

// The level named by `text`; nothing for a name that is none (the caller warns once).
std::optional<level> parse_level(const char* text) {
  if (text == nullptr || *text == '\0') return level::warn;
  if (!std::strcmp(text, "trace")) return level::trace;
  if (!std::strcmp(text, "debug")) return level::debug;
  if (!std::strcmp(text, "info")) return level::info;
  if (!std::strcmp(text, "warn") || !std::strcmp(text, "warning")) return level::warn;
  if (!std::strcmp(text, "error")) return level::error;
  if (!std::strcmp(text, "off")) return level::off;
  return std::nullopt;
}

spdlog::level::level_enum to_spdlog(level l) {
  switch (l) {
    case level::trace: return spdlog::level::trace;
    case level::debug: return spdlog::level::debug;
    case level::info: return spdlog::level::info;
    case level::warn: return spdlog::level::warn;
    case level::error: return spdlog::level::err;
    case level::off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

spdlog::logger& logger() {
  // Created on the first message only: a process that never logs opens no file.
  static std::unique_ptr<spdlog::logger> instance = [] {
    std::shared_ptr<spdlog::sinks::sink> sink;
    const char* path = std::getenv("VMMCKPT_LOG_FILE");
    if (path != nullptr && *path != '\0') {
      try {
        sink = std::make_shared<spdlog::sinks::basic_file_sink_st>(path, false);
      } catch (...) {
        // An unwritable log file must not break the program: fall back to stderr.
      }
    }
    if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_st>();
    auto l = std::make_unique<spdlog::logger>("vmmckpt", std::move(sink));
    l->set_pattern("[vmmckpt %P %Y-%m-%d %H:%M:%S.%e %l] %v");
    l->set_level(spdlog::level::trace);
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *instance;
}

}  // namespace

level threshold() noexcept {
  static const level value = [] {
    const char* text = std::getenv("VMMCKPT_LOG_LEVEL");
    if (const auto known = parse_level(text)) return *known;
    // A misspelt level must not pass unnoticed, nor stop anything: said once (this runs once), and
    // without throwing (inside the shim too).
    try {
      write(level::warn, std::string("VMMCKPT_LOG_LEVEL='") + text +
                             "' is not a level (trace, debug, info, warn, error, off); using warn");
    } catch (...) {
    }
    return level::warn;
  }();
  return value;
}

void write(level l, std::string_view message) noexcept {
  try {
    std::lock_guard lock(log_mutex());
    logger().log(to_spdlog(l), "{}", message);
  } catch (...) {
    // Logging never takes the host program down.
  }
}

void hold_for_fork() noexcept {
  try {
    log_mutex().lock();
  } catch (...) {
  }
}
void release_after_fork() noexcept { log_mutex().unlock(); }

}  // namespace vmmckpt::log
