#include "core/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace deepinfer {

namespace {
std::atomic<LogLevel> g_level{LogLevel::Info};
const auto g_start = std::chrono::steady_clock::now();
std::mutex g_mutex;
constexpr const char* kLevelNames[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};
}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

void log_write(LogLevel level, std::string_view message) {
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
  std::lock_guard lock(g_mutex);
  std::fprintf(stderr, "[%9.3f %-5s] %.*s\n", t, kLevelNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace deepinfer
