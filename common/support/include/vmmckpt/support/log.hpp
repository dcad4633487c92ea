// The logger of code that runs inside the program (the shim, the restore engine): spdlog compiled in with hidden symbols.
//
// Nothing here throws: a message that cannot be formatted or written (no memory, a full disk) is
// dropped, so a log line can stand anywhere in an entry point. Off the hot path unless enabled.
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace vmmckpt::log {

enum class level { trace, debug, info, warn, error, off };

// The level set by VMMCKPT_LOG_LEVEL (default warn); read once.
level threshold() noexcept;
inline bool enabled(level l) noexcept { return l >= threshold(); }
void write(level l, std::string_view message) noexcept;

template <typename... Args>
void at(level l, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!enabled(l)) return;
  try {
    write(l, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
    // Formatting ran out of memory: the message is lost, the caller goes on.
  }
}
// log::info("...", args) and its siblings: `at` with the level fixed.
template <level L>
struct at_level {
  template <typename... Args>
  void operator()(fmt::format_string<Args...> format, Args&&... args) const noexcept {
    at(L, format, std::forward<Args>(args)...);
  }
};
inline constexpr at_level<level::debug> debug;
inline constexpr at_level<level::info> info;
inline constexpr at_level<level::warn> warn;
inline constexpr at_level<level::error> error;

// fork(): the child must not inherit a logger lock held by another thread.
void hold_for_fork() noexcept;
void release_after_fork() noexcept;

}  // namespace vmmckpt::log
