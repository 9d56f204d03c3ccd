#pragma once
// The collectives this rank runs, one record per tensor, while someone listens
// (Runtime::setOpLog): DeepSpeed's comms logger is built on it. Shared by the
// rank's executors; appends take a lock only while the log is on.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
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
  // A collective's record lands just after its tensors complete: take(settle) waits
  // (a little, since another set's op may be in flight for long) for those under way;
  // take(false), for a caller that drains often, does not.
  void begin() { open_.fetch_add(1, std::memory_order_acq_rel); }
  void end() { open_.fetch_sub(1, std::memory_order_acq_rel); }
  std::vector<OpRecord> take(bool settle = true) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(settle ? 200 : 0);
    while (open_.load(std::memory_order_acquire) > 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(records_, {});
  }

 private:
  std::atomic<int> open_{0};
  std::atomic<bool> on_{false};
  std::mutex mu_;
  std::vector<OpRecord> records_;
};

}  // namespace chorus
