#include "rendezvous/refusal_log.h"

#include <vector>

#include "base/logging.h"

namespace chorus::rendezvous {

namespace {
constexpr size_t kMaxSources = 4096;

std::string addressOf(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}
}  // namespace

void RefusalLog::refuse(const std::string& peer, const std::string& why) {
  ++count_;
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::string address = addressOf(peer);
    if (!sources_.count(address) && sources_.size() >= kMaxSources) address = "other addresses";
    auto [it, first] = sources_.try_emplace(address);
    if (first) {
      line = "chorus store: refused a connection from " + peer + ": " + why;
    } else {
      ++it->second.since;
      it->second.lastWhy = why;
    }
  }
  if (!line.empty()) logLine(LogLevel::kWarning, -1, line);
  flush();
}

void RefusalLog::flush(bool force) {
  std::vector<std::string> lines;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - lastFlush_ < every_) return;
    const double secs = std::chrono::duration<double>(now - lastFlush_).count();
    lastFlush_ = now;
    for (auto& [address, s] : sources_) {
      if (s.since == 0) continue;
      char span[32];
      std::snprintf(span, sizeof(span), "%.0f", secs);
      lines.push_back("chorus store: refused " + std::to_string(s.since) + " more from " + address + " in the last " +
                      span + " s (the last: " + s.lastWhy + ")");
      s.since = 0;
    }
  }
  for (const auto& l : lines) logLine(LogLevel::kWarning, -1, l);
}

}  // namespace chorus::rendezvous
