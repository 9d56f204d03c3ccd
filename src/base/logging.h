#pragma once
// Minimal leveled logging to stderr; one line per call, prefixed with the rank.
#include <sstream>
#include <string>

#include "chorus/config.h"

namespace chorus {

void setLogLevel(LogLevel level);
LogLevel logLevel();
void logLine(LogLevel level, int rank, const std::string& text);

#define CHORUS_LOG(level, rank, expr)                                 \
  do {                                                                \
    if (static_cast<int>(level) >= static_cast<int>(::chorus::logLevel())) { \
      std::ostringstream chorus_log_os_;                              \
      chorus_log_os_ << expr;                                         \
      ::chorus::logLine(level, rank, chorus_log_os_.str());           \
    }                                                                 \
  } while (0)

#define CHORUS_WARN(rank, expr) CHORUS_LOG(::chorus::LogLevel::kWarning, rank, expr)
#define CHORUS_INFO(rank, expr) CHORUS_LOG(::chorus::LogLevel::kInfo, rank, expr)
#define CHORUS_DEBUG(rank, expr) CHORUS_LOG(::chorus::LogLevel::kDebug, rank, expr)

}  // namespace chorus
