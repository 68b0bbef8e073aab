// Minimal leveled logging to stderr with elapsed-time stamps.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace deepinfer {

enum class LogLevel : uint8_t { Debug, Info, Warn, Error, Off };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... a) {
  if (log_level() <= LogLevel::Debug) log_write(LogLevel::Debug, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... a) {
  if (log_level() <= LogLevel::Info) log_write(LogLevel::Info, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... a) {
  if (log_level() <= LogLevel::Warn) log_write(LogLevel::Warn, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... a) {
  if (log_level() <= LogLevel::Error) log_write(LogLevel::Error, fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace deepinfer
