// Leveled logging to stderr. The level comes from DEEPINFER_LOG_LEVEL
// (trace|debug|info|warn|error|off, default info) or set_log_level().
#pragma once

#include <string_view>

#include "core/error.h"

namespace deepinfer {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

LogLevel log_level();
void set_log_level(LogLevel level);
// Parses a level name; throws Error naming the accepted values otherwise.
LogLevel parse_log_level(std::string_view name);
void write_log(LogLevel level, std::string_view message);

}  // namespace deepinfer

#define DI_LOG(level, ...)                                                             \
  do {                                                                                 \
    if (::deepinfer::LogLevel::level >= ::deepinfer::log_level()) {                    \
      ::deepinfer::write_log(::deepinfer::LogLevel::level, ::deepinfer::concat(__VA_ARGS__)); \
    }                                                                                  \
  } while (false)
#define DI_LOG_DEBUG(...) DI_LOG(kDebug, __VA_ARGS__)
#define DI_LOG_INFO(...) DI_LOG(kInfo, __VA_ARGS__)
#define DI_LOG_WARN(...) DI_LOG(kWarn, __VA_ARGS__)
#define DI_LOG_ERROR(...) DI_LOG(kError, __VA_ARGS__)
