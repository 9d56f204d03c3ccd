#pragma once
// Runs an ordered list of responses on a communicator: packs compatible
// allreduces into the fusion buffer, allocates outputs, completes entries.
#include <atomic>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/entry.h"
#include "core/timeline.h"

namespace chorus {

class Executor {
 public:
  using Release = std::function<void(const std::string& name)>;
  // release(name) runs just before an entry's Work completes, so that the name
  // may be reused by the caller as soon as it sees the result.
  // timeline: where ops are recorded while it is active (may be null).
  Executor(Communicator& comm, int64_t fusionThresholdBytes, Release release, Timeline* timeline = nullptr,
           int32_t setId = 0)
      : comm_(comm), threshold_(fusionThresholdBytes), release_(std::move(release)), timeline_(timeline),
        setId_(setId) {}
  void setFusionThreshold(int64_t bytes) { threshold_.store(bytes, std::memory_order_relaxed); }
  int64_t fusionThreshold() const { return threshold_.load(std::memory_order_relaxed); }

  // Takes the matching entries out of `entries` and completes them. A rank with
  // no entry for a response (it has joined) takes part with zeros. Transport
  // errors propagate after the entries of the failed step were failed with them.
  // fromPayload: responses is one op whose inputs every rank sent with the
  // negotiation just before (Controller): done from there, with no exchange.
  void execute(const Response* responses, size_t count, EntryTable& entries, bool fromPayload = false);

  int64_t allreduceBatches() const { return batches_; }
  int64_t allreduceTensors() const { return tensors_; }

 private:
  void runAllreduce(const std::vector<const Response*>& group, EntryTable& entries, bool fromPayload);
  void runAdasum(const std::vector<const Response*>& group, EntryTable& entries, bool fromPayload);
  void runAllgather(const Response& r, EntryTable& entries, bool fromPayload);
  void runBroadcast(const Response& r, EntryTable& entries, bool fromPayload);
  void runAlltoall(const Response& r, EntryTable& entries, bool fromPayload);
  void runReducescatter(const Response& r, EntryTable& entries, bool fromPayload);
  // Rank j's input of an op that went with its negotiation (mine: my own input).
  const char* sent(int j, const void* mine) const;
  // Every rank's, `at` bytes in, for a reduction (valid until the next call).
  const void* const* sentInputs(const void* mine, size_t at);
  void runSimple(const Response& r, EntryTable& entries);
  void fail(const Response& r, EntryTable& entries);

  Communicator& comm_;
  std::atomic<int64_t> threshold_;  // changed between cycles by autotune; read by stats()
  const char* transportOf(bool fromPayload) const;
  Release release_;
  Timeline* timeline_;
  int32_t setId_;  // the process set, for the timeline
  std::vector<char> scratch_;
  std::vector<char> gathered_;   // every rank's inputs of an Adasum allreduce
  std::vector<char> joinedOut_;  // a joined rank's reducescatter block, discarded
  std::vector<const Response*> group_;  // scratch of execute: one fused allreduce
  std::vector<Span> spans_;             // scratch of runAllreduce
  std::vector<const void*> payloadInputs_;
  std::atomic<int64_t> batches_{0};
  std::atomic<int64_t> tensors_{0};
};

// Allocates an output through the entry's allocator, or in storage the Work owns.
// If the allocator fails, the rank still takes part (in chorus's own storage, so
// the others are not left waiting) and *err is set to fail the entry afterwards.
void* allocateOutput(Entry& e, const Shape& shape, std::exception_ptr* err);
// Marks the entry done with `output` as its result and removes it from the table.
void finishEntry(EntryTable& entries, EntryTable::iterator it, const Executor::Release& release,
                 std::exception_ptr err = nullptr);

}  // namespace chorus
