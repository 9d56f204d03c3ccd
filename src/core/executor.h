#pragma once
// Runs an ordered list of responses on a communicator: packs compatible
// allreduces into the fusion buffer, allocates outputs, completes entries.
#include <atomic>
#include <chrono>
#include <climits>
#include <memory>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "core/entry.h"
#include "core/executor_device.h"
#include "core/op_log.h"
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
      : comm_(comm),
        threshold_(fusionThresholdBytes),
        release_([this, r = std::move(release)](const std::string& name) {
          finishedSome_ = true;
          if (r) r(name);
        }),
        timeline_(timeline),
        setId_(setId) {}
  // Called before more work runs in the same call once some op has completed
  // in it: a thread waiting for that op need not wait for the rest.
  void setProgressHook(std::function<void()> hook) { progress_ = std::move(hook); }
  void setFusionThreshold(int64_t bytes) { threshold_.store(bytes, std::memory_order_relaxed); }
  int64_t fusionThreshold() const { return threshold_.load(std::memory_order_relaxed); }
  // Allreduces over this many bytes run one chunk per call of execute, so that a
  // higher-priority op negotiated in between goes first; 0: every op runs whole.
  void setChunkBytes(int64_t bytes) { chunkBytes_ = bytes; }
  // Where this executor records each tensor's collective while the log is on.
  void setOpLog(std::shared_ptr<OpLog> log) { opLog_ = std::move(log); }
  void recordOp(const Response& r, double seconds);
  OpLog* listeningLog() const { return opLog_ && opLog_->on() ? opLog_.get() : nullptr; }
  int64_t chunkBytes() const { return chunkBytes_; }

  // Takes the matching entries out of `entries` and completes them. A rank with
  // no entry for a response (it has joined) takes part with zeros. Transport
  // errors propagate after the entries of the failed step were failed with them.
  // fromPayload: responses is one op whose inputs every rank sent with the
  // negotiation just before (Controller): done from there, with no exchange,
  // ahead of any queued work (the controller sends one only with a higher
  // priority than queuedPriority()).
  // With chunking, a call moves about chunkBytes() and queues the rest, ordered
  // by priority (first come first among equals), for the next calls; every rank
  // makes the same calls, so all run the same chunks in the same order.
  // holdChunks: run no chunk in this call (an op that outranks it is about to
  // be agreed; the controller decides, the same on every rank).
  void execute(const Response* responses, size_t count, EntryTable& entries, bool fromPayload = false,
               bool holdChunks = false);
  // Work is queued for the next call (readable from any thread).
  bool busy() const { return busy_.load(std::memory_order_relaxed); }
  // The highest priority of the queued work; INT_MIN when there is none.
  int32_t queuedPriority() const;
  // Forgets the queued work (its entries were failed by the caller).
  void drop();

  // CUDA tensors: how to reach the device (set before the first cycle).
  void setDevice(DeviceSettings s) { deviceSettings_ = std::move(s); }
  // The set's path for CUDA tensors ("NCCL", "STAGED"; "" before its first device
  // op) and why it was chosen.
  std::string gpuPath() const;
  std::string gpuPathReason() const;
  // A failure ends the set: makes peers waiting in the device path fail now.
  void abortDevice();

  int64_t allreduceBatches() const { return batches_; }
  int64_t allreduceTensors() const { return tensors_; }
  // The collectives run so far, by op and path (ProcessSetStats::ops).
  std::vector<OpStat> opStats() const;
  // Adds one collective (thread-safe; the executor's thread calls it).
  void tally(OpType type, const char* path, size_t tensors, size_t bytes, double seconds, bool counts = true);

 private:
  // A fused allreduce run chunk by chunk over several calls.
  struct Chunked {
    std::vector<Response> group;
    std::vector<Span> spans;
    std::vector<size_t> ends;  // element offset where each tensor's span ends
    std::vector<char> zeros;   // a joined rank's part
    size_t total = 0, done = 0, finished = 0;  // elements; tensors completed
    std::chrono::steady_clock::time_point started;
    int32_t priority() const { return group[finished].priority; }
  };
  // Runs ops from `src` (sorted by priority) until *spent reaches budget;
  // returns how many it took (a group too large for one chunk starts chunked).
  size_t runSome(const Response* src, size_t count, EntryTable& entries, bool fromPayload, size_t* spent,
                 size_t budget);
  size_t groupAt(const Response* src, size_t count, size_t i);  // end of the fused group from i
  size_t takeGroup(const Response* src, size_t i, size_t j);    // src[i, j) into group_; their bytes
  void startChunked(const Response* group, size_t n, EntryTable& entries);
  void runChunk(EntryTable& entries, size_t* spent);
  void mergeQueue(const Response* responses, size_t count);
  // Spans of a fused allreduce (zeros for a joined rank); prescaled inputs are
  // scaled into the outputs.
  void buildSpans(const Response* const* group, size_t n, EntryTable& entries, std::vector<Span>& spans,
                  std::vector<char>& zeros);
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
  DeviceRunner& device(const Response& r, EntryTable& entries);  // made at the set's first device op
  DeviceSettings deviceSettings_;
  std::unique_ptr<DeviceRunner> device_;
  mutable std::mutex deviceMu_;  // device_'s creation against gpuPath()
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
  int64_t chunkBytes_ = 0;
  std::function<void()> progress_;
  bool finishedSome_ = false;  // an entry completed since progress_ last ran
  void progressed() {
    if (!finishedSome_) return;
    finishedSome_ = false;
    if (progress_) progress_();
  }
  std::vector<Response> queue_;      // negotiated, not started; by priority
  std::vector<Response> merged_;     // scratch of mergeQueue
  std::vector<Chunked> chunked_;     // started, not finished; the last preempted the others
  std::vector<Span> chunkSpans_;     // scratch of runChunk
  std::atomic<bool> busy_{false};
  std::atomic<int64_t> batches_{0};
  std::atomic<int64_t> tensors_{0};
  std::shared_ptr<OpLog> opLog_;
  mutable std::mutex tallyMu_;
  // A handful of (op, path) rows, found by a scan: nothing is allocated per collective.
  std::vector<std::pair<OpType, OpStat>> tallies_;
};

// Allocates an output through the entry's allocator, or in storage the Work owns.
// If the allocator fails, the rank still takes part (in chorus's own storage, so
// the others are not left waiting) and *err is set to fail the entry afterwards.
// own: where chorus's storage comes from (null: host memory from its pool);
// device: what the output tensor says of where it is.
using OwnStorage = std::function<std::shared_ptr<void>(size_t bytes)>;
void* allocateOutput(Entry& e, const Shape& shape, std::exception_ptr* err, const OwnStorage& own = nullptr,
                     int32_t device = kHostDevice);
// Marks the entry done with `output` as its result and removes it from the table.
void finishEntry(EntryTable& entries, EntryTable::iterator it, const Executor::Release& release,
                 std::exception_ptr err = nullptr);

}  // namespace chorus
