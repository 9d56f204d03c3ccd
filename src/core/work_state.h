#pragma once
// Shared completion state behind a Work handle; completed from controller threads.
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "chorus/types.h"

namespace chorus {

class WorkState {
 public:
  explicit WorkState(size_t parts) : outputs(parts), remaining_(parts) {}

  // Marks one part finished; the first error wins.
  void complete(std::exception_ptr err);
  bool done() const;
  void wait() const;
  bool waitFor(std::chrono::milliseconds timeout) const;
  std::exception_ptr error() const;

  // Written by the controller before complete(); read after done().
  std::vector<Tensor> outputs;
  std::vector<std::shared_ptr<std::vector<char>>> owned;  // storage chorus allocated
  std::vector<int64_t> receivedSplits;
  int joinResult = -1;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  size_t remaining_;
  std::exception_ptr error_;
};

}  // namespace chorus
