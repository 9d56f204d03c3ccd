#include "base/logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace chorus {

namespace {
std::atomic<int> gLevel{static_cast<int>(LogLevel::kWarning)};
std::mutex gMutex;
const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kFatal: return "FATAL";
  }
  return "?";
}
}  // namespace

// The level is process-wide on purpose: it is a property of stderr, not of a rank.
void setLogLevel(LogLevel level) { gLevel = static_cast<int>(level); }
LogLevel logLevel() { return static_cast<LogLevel>(gLevel.load()); }

void logLine(LogLevel level, int rank, const std::string& text) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (rank < 0) {  // not a rank's line: the launcher's store, for one
    std::fprintf(stderr, "[chorus %s] %s\n", levelName(level), text.c_str());
  } else {
    std::fprintf(stderr, "[chorus %s rank %d] %s\n", levelName(level), rank, text.c_str());
  }
  std::fflush(stderr);
}

}  // namespace chorus
