// The shim's logger: spdlog compiled in with hidden symbols, off the hot path unless enabled.
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace vmmckpt::detail::log {

enum class level { trace, debug, info, warn, error, off };

// The level set by VMMCKPT_LOG_LEVEL (default warn); read once.
level threshold();
inline bool enabled(level l) { return l >= threshold(); }
void write(level l, std::string_view message);

template <typename... Args>
void at(level l, fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(l)) write(l, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) { at(level::debug, f, std::forward<Args>(a)...); }
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... a) { at(level::info, f, std::forward<Args>(a)...); }
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) { at(level::warn, f, std::forward<Args>(a)...); }
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... a) { at(level::error, f, std::forward<Args>(a)...); }

// fork(): the child must not inherit a logger lock held by another thread.
void hold_for_fork();
void release_after_fork();

}  // namespace vmmckpt::detail::log
