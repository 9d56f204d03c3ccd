#pragma once
// Shared completion state behind a Work handle; completed from controller threads.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "chorus/types.h"
#include "core/cycle_driver.h"
#include "device/device_handles.h"

namespace chorus {

class WorkState {
 public:
  explicit WorkState(size_t parts) : outputs(parts), remaining_(parts) {}

  // Marks one part finished; the first error wins.
  void complete(std::exception_ptr err);
  bool done() const;
  // Runs the set's cycles on the calling thread while it can (see CycleDriver).
  void wait() const { waitUnless(nullptr); }
  // wait() that asks *interrupted (when given) every 50 ms or so and returns false,
  // the op still in flight, once it says so.
  bool waitUnless(const std::function<bool()>* interrupted) const;
  bool waitFor(std::chrono::milliseconds timeout) const;
  bool driveFor(std::chrono::microseconds budget) const;
  // Runs fn when done (now, if it is): see Work::whenDone.
  void whenDone(std::function<void()> fn);
  std::exception_ptr error() const;

  // Written by the controller before complete(); read after done().
  std::vector<Tensor> outputs;
  std::vector<std::shared_ptr<void>> owned;  // storage chorus allocated
  std::vector<int64_t> receivedSplits;
  int joinResult = -1;
  // CUDA tensors: recorded on chorus's stream after each part's device work.
  std::shared_ptr<DeviceEvent> deviceDone;
  std::shared_ptr<CycleDriver> driver;  // set before the op is enqueued
  mutable std::atomic<bool> driverEntered{false};  // the submitter entered the driver for wait()

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::atomic<size_t> remaining_;  // written under mu_; done() reads it without
  std::exception_ptr error_;
  std::vector<std::function<void()>> callbacks_;  // under mu_; run once done
};

}  // namespace chorus
