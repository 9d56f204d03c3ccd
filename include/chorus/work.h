#pragma once
// The handle of an asynchronous collective.
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "chorus/error.h"
#include "chorus/types.h"

namespace chorus {

class WorkState;

class Work {
 public:
  explicit Work(std::shared_ptr<WorkState> state);

  // True once the op has finished (successfully or not). Never blocks.
  bool poll() const;
  // Blocks until done; rethrows the op's error. Meanwhile the calling thread runs
  // the process set's negotiation cycles itself (no hand-off to the set's thread).
  void wait() const;
  // Like wait(), but calls interrupted() every 50 ms or so while the op runs and
  // returns false as soon as it says true; the op stays in flight (its buffers
  // must stay valid until it is done). For callers that must see signals.
  bool waitUnless(const std::function<bool()>& interrupted) const;
  // Like wait() but gives up after the timeout; returns whether it finished.
  bool waitFor(std::chrono::milliseconds timeout) const;
  // Calls fn once the op has finished (successfully or not): at once on this
  // thread when it already has, else on the thread that finishes it, which is
  // chorus's own (keep fn short; it must not wait for another op). For
  // frameworks whose kernels complete by callback (TensorFlow's AsyncOpKernel).
  void whenDone(std::function<void()> fn) const;
  // Runs the set's negotiation cycles on this thread, as wait() does, but for
  // about budget at most (plus the cycle under way); returns whether the op is
  // done. Saves a small op the hand-offs to and from chorus's thread without
  // holding a caller that may not block (a TensorFlow kernel) for long.
  bool driveFor(std::chrono::microseconds budget) const;

  // Outputs, one per input tensor (allgather, alltoall, reducescatter allocate them).
  const std::vector<Tensor>& outputs() const;
  const Tensor& output(size_t i = 0) const { return outputs().at(i); }
  // alltoall: the number of first-dimension rows received from each rank.
  const std::vector<int64_t>& receivedSplits() const;
  // join: the last rank to join.
  int joinResult() const;
  std::exception_ptr error() const;
  // CUDA tensors: once the op is done on the host (wait(), poll()), its device
  // work may still run; work queued on stream after this call sees its results
  // (a GPU-side wait; the host is not held). No-op for host tensors.
  void streamWait(void* stream) const;
  // The host waits for the op's device work too (C++ callers with no stream).
  void synchronizeDevice() const;

  const std::shared_ptr<WorkState>& state() const { return state_; }

 private:
  std::shared_ptr<WorkState> state_;
};

// A wait given up on request (a signal reached the caller); work() is the op,
// still in flight, whose buffers must stay valid until it is done.
class Interrupted : public Error {
 public:
  explicit Interrupted(Work w) : Error("the wait was interrupted; the op is still in flight"), work_(std::move(w)) {}
  const Work& work() const { return work_; }

 private:
  Work work_;
};

}  // namespace chorus
