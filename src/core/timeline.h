#pragma once
// Horovod's timeline: a Chrome trace (chrome://tracing, Perfetto) of every
// tensor's negotiation and execution, written by rank 0. Each tensor name is a
// trace "process" with three spans in turn: NEGOTIATE_<OP> (a tick per rank
// whose request was seen; requests served from the response cache have none),
// QUEUE (agreed, waiting behind other work: higher priorities, a chunked large
// op) and <TRANSPORT>_<OP> (SHM_ALLREDUCE, TCP_ALLGATHER, MPI_..., HIERARCHICAL_...,
// INLINE_... when the data rode with the negotiation) covering the collective,
// with its bytes, dtype, priority, process set and fused-tensor count as args.
// Events are queued in memory by the data path and
// written by a thread of the timeline's own every 50 ms; each write ends with
// the array's closing bracket, which the next write overwrites, so the file on
// disk is valid JSON at every moment: a running or killed job's trace opens too.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/message.h"

namespace chorus {

// What an op span carries (its "args" in the trace).
struct OpSpanArgs {
  size_t bytes = 0;
  DataType dtype = DataType::kFloat32;
  int32_t priority = 0;
  int32_t processSet = 0;
  const char* transport = "";  // SHM, TCP, MPI, HIERARCHICAL; INLINE when its data rode with the negotiation
  size_t fused = 1;            // tensors in the collective that carried it
};

class Timeline {
 public:
  ~Timeline();
  // Throws InvalidArgument naming the path when it cannot be written, or when a
  // timeline is already being written.
  void start(const std::string& path, bool markCycles);
  // Completes the trace and moves it into place; a no-op when not started.
  void stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }

  void negotiateStart(const std::string& name, OpType type);
  void rankReady(const std::string& name, int rank);
  void negotiateEnd(const std::string& name);
  void opStart(const std::string& name, OpType type, const OpSpanArgs& args = {});
  void opEnd(const std::string& name);
  // A step inside an op's span (MEMCPY_IN_FUSION_BUFFER, WAIT_FOR_DATA...).
  void activityStart(const std::string& name, const char* activity);
  void activityEnd(const std::string& name);
  void cycleStart();

 private:
  int64_t micros() const;
  int pidOf(const std::string& name);  // with mu_ held
  void write(const std::string& event);  // with mu_ held: queues it
  // Appends a chunk of events and the closing bracket, which the next chunk
  // overwrites (the writer thread, or stop() once it has ended).
  bool writeChunk(const std::string& chunk);
  void flushLoop();

  std::mutex mu_;
  std::FILE* file_ = nullptr;        // written only by the writer thread (and start/stop around it)
  std::atomic<bool> active_{false};  // recording; readable without mu_
  std::string pending_;              // guarded by mu_: events not yet written
  bool stopping_ = false;            // guarded by mu_
  std::string path_;
  bool markCycles_ = false;
  bool first_ = true;  // no comma before the first event
  std::chrono::steady_clock::time_point start_;
  std::unordered_map<std::string, int> pids_;
  std::unordered_set<std::string> negotiating_;  // names inside a NEGOTIATE span
  std::unordered_set<std::string> queued_;       // names inside a QUEUE span
  std::condition_variable flushCv_;
  std::thread flusher_;
};

// "ALLREDUCE", "ALLGATHER", ...: the phase names Horovod's timeline uses.
const char* timelineOpName(OpType type);

}  // namespace chorus
