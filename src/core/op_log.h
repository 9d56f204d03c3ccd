#pragma once
// The collectives this rank runs, one record per tensor, while someone listens
// (Runtime::setOpLog): DeepSpeed's comms logger is built on it. Shared by the
// rank's executors; appends take a lock only while the log is on.
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "chorus/runtime.h"

namespace chorus {

class OpLog {
 public:
  bool on() const { return on_.load(std::memory_order_relaxed); }
  void set(bool on) { on_.store(on, std::memory_order_relaxed); }
  void add(OpRecord r) {
    std::lock_guard<std::mutex> lock(mu_);
    records_.push_back(std::move(r));
  }
  std::vector<OpRecord> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(records_, {});
  }

 private:
  std::atomic<bool> on_{false};
  std::mutex mu_;
  std::vector<OpRecord> records_;
};

}  // namespace chorus
