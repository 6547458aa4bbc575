#include "core/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace deepinfer {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("DEEPINFER_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kInfo;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    std::fprintf(stderr, "[deepinfer warn] ignoring DEEPINFER_LOG_LEVEL=%s (expected trace|debug|info|warn|error|off)\n", env);
    return LogLevel::kInfo;
  }
}

std::atomic<LogLevel>& level_storage() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

}  // namespace

LogLevel log_level() { return level_storage().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_storage().store(level, std::memory_order_relaxed); }

LogLevel parse_log_level(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(LogLevel::kOff); ++i) {
    auto level = static_cast<LogLevel>(i);
    if (name == level_name(level)) return level;
  }
  DI_THROW("unknown log level '", name, "': expected one of trace, debug, info, warn, error, off");
}

void write_log(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "[deepinfer %s %lld.%03lld] %.*s\n", level_name(level),
               static_cast<long long>(now / 1000), static_cast<long long>(now % 1000),
               static_cast<int>(message.size()), message.data());
}

}  // namespace deepinfer
