#pragma once
// What the store says of connections it refuses: each one counted; the first
// from a source address logged with its reason; later ones from that address
// summed into one line per address every summary period. Bounded: past a few
// thousand addresses, the rest share one entry.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace chorus::rendezvous {

class RefusalLog {
 public:
  explicit RefusalLog(std::chrono::milliseconds summaryEvery) : every_(summaryEvery) {}
  // peer: "address:port"; why: the reason, as a line's end.
  void refuse(const std::string& peer, const std::string& why);
  // Writes the summary lines that are due (call it now and then).
  void flush(bool force = false);
  int64_t count() const { return count_.load(); }

 private:
  struct Source {
    int64_t since = 0;
    std::string lastWhy;
  };
  std::chrono::milliseconds every_;
  std::atomic<int64_t> count_{0};
  std::mutex mu_;
  std::map<std::string, Source> sources_;
  std::chrono::steady_clock::time_point lastFlush_ = std::chrono::steady_clock::now();
};

}  // namespace chorus::rendezvous
