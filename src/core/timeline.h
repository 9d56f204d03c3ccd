#pragma once
// Horovod's timeline: a Chrome trace (chrome://tracing, Perfetto) of every
// tensor's negotiation and execution, written by rank 0. Each tensor name is a
// trace "process"; its NEGOTIATE_<OP> span holds a tick per rank whose request
// was seen (requests served from the response cache have none), and its <OP>
// span covers the collective. The file is written to `path.tmp` and renamed to
// `path` when the timeline stops, so a reader never sees half a trace.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/message.h"

namespace chorus {

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
  void opStart(const std::string& name, OpType type);
  void opEnd(const std::string& name);
  void cycleStart();

 private:
  int64_t micros() const;
  int pidOf(const std::string& name);  // with mu_ held
  void write(const std::string& event);  // with mu_ held
  void finish();                         // with mu_ held

  std::mutex mu_;
  std::FILE* file_ = nullptr;
  std::atomic<bool> active_{false};  // file_ != nullptr, readable without mu_
  std::string path_;
  bool markCycles_ = false;
  bool first_ = true;  // no comma before the first event
  std::chrono::steady_clock::time_point start_;
  std::unordered_map<std::string, int> pids_;
  std::unordered_set<std::string> negotiating_;  // names inside a NEGOTIATE span
};

// "ALLREDUCE", "ALLGATHER", ...: the phase names Horovod's timeline uses.
const char* timelineOpName(OpType type);

}  // namespace chorus
