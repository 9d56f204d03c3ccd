#pragma once
// The handle of an asynchronous collective.
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

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
  // Like wait() but gives up after the timeout; returns whether it finished.
  bool waitFor(std::chrono::milliseconds timeout) const;

  // Outputs, one per input tensor (allgather, alltoall, reducescatter allocate them).
  const std::vector<Tensor>& outputs() const;
  const Tensor& output(size_t i = 0) const { return outputs().at(i); }
  // alltoall: the number of first-dimension rows received from each rank.
  const std::vector<int64_t>& receivedSplits() const;
  // join: the last rank to join.
  int joinResult() const;
  std::exception_ptr error() const;

  const std::shared_ptr<WorkState>& state() const { return state_; }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace chorus
