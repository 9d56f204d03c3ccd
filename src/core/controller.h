#pragma once
// The background loop of one process set: every cycle it exchanges one small
// bit vector (cache hits, sizes of new requests, flags), negotiates new
// requests through the coordinator, and executes what is ready everywhere.
// Each set has its own thread and communicator, so sets progress independently;
// a thread waiting for one of the set's ops runs the cycles in its stead.
#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "chorus/config.h"
#include "comm/communicator.h"
#include "core/autotune/tuner.h"
#include "core/coordinator.h"
#include "core/cycle_driver.h"
#include "core/entry.h"
#include "core/executor.h"
#include "core/name_registry.h"
#include "core/response_cache.h"
#include "core/timeline.h"

namespace chorus {

class Controller {
 public:
  // control: where negotiation runs (null: over the data communicator).
  // registry: the rank's names in flight on every set (shared by its controllers).
  int32_t setId() const { return setId_; }
  Controller(int32_t setId, std::vector<int> globalRanks, int globalRank,
             std::unique_ptr<Communicator> comm, const Config& config,
             std::unique_ptr<Communicator> control = nullptr,
             std::shared_ptr<NameRegistry> registry = std::make_shared<NameRegistry>(),
             std::shared_ptr<Timeline> timeline = nullptr);
  ~Controller();

  void start();
  void setOpLog(std::shared_ptr<OpLog> log) { executor_.setOpLog(std::move(log)); }
  // Enqueues atomically: all entries or none. Throws InvalidArgument on a
  // duplicate name in flight, or the stored error if the set has failed.
  // wake = false: the caller waits at once and drives the cycle itself.
  void enqueue(std::vector<Entry> entries, bool wake = true);
  // Hands a waiting thread this set's cycles (see CycleDriver).
  const std::shared_ptr<CycleDriver>& driver() const { return driver_; }
  // Asks every member to stop at the next cycle; join() waits for the thread.
  void requestShutdown();
  void join();
  int rank() const { return comm_->rank(); }
  ProcessSetStats stats() const;
  int size() const { return comm_->size(); }

 private:
  void loop();
  // One cycle, with cycleMu_ held; on a failure or an agreed stop it fails every
  // pending op and returns false, and no cycle runs again.
  bool runCycle();
  bool driveCycle(const std::function<bool()>& done);
  void cycle();
  void failAll(std::exception_ptr err);
  void inspectStalls(std::chrono::steady_clock::time_point now);
  void watchBlocked(uint64_t flags, std::chrono::steady_clock::time_point now);
  void releaseName(const std::string& name);
  void detectConflicts();

  const int32_t setId_;
  const std::vector<int> globalRanks_;
  const int globalRank_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Communicator> control_;
  Communicator& ctl() { return control_ ? *control_ : *comm_; }
  const Config config_;
  Coordinator coordinator_;
  ResponseCache cache_;
  std::shared_ptr<NameRegistry> registry_;
  Executor executor_;

  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Entry> incoming_;
  bool wakePending_ = false;                   // guarded by mu_: an enqueue asked for a cycle
  std::exception_ptr failure_;                 // guarded by mu_
  std::atomic<bool> shutdownRequested_{false};
  std::thread thread_;
  // Cycles run on the controller thread or on a waiting caller's, one at a time.
  std::mutex cycleMu_;
  // A thread that would drive while another runs a cycle waits here for the
  // cycle's end or its own op, whichever comes first (see driveCycle).
  std::mutex idleMu_;
  std::condition_variable idleCv_;
  std::atomic<int> idleWaiters_{0};
  std::atomic<bool> inCycle_{false};
  void wakeIdleWaiters();
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> lastCycleEnd_{0};  // steady_clock ticks
  std::shared_ptr<CycleDriver> driver_;
  std::atomic<int64_t> cycles_{0};
  std::atomic<int64_t> negotiated_{0};
  std::atomic<int64_t> cached_{0};
  std::atomic<int64_t> speculated_{0};
  std::shared_ptr<Timeline> timeline_;  // null, or recording when rank 0 started it

  // Cycle state, guarded by cycleMu_.
  EntryTable entries_;
  std::map<int, EntryTable::value_type*> cachedPending_;  // cache position -> its entry in entries_
  std::vector<Request> resend_;               // cached requests invalidated last cycle
  // Scratch kept from cycle to cycle, so that a cycle allocates little.
  std::vector<Entry> fresh_;
  std::vector<uint64_t> words_;
  std::vector<size_t> sizes_;
  std::vector<Response> ready_;
  bool stallShutdown_ = false;
  // Since when every rank has been blocked on ops others never submitted, and
  // whether this rank asks (next cycle) that those ops fail (see cycle()).
  std::optional<std::chrono::steady_clock::time_point> blockedSince_;
  bool failBlocked_ = false;
  int heldChunks_ = 0;  // cycles in a row that held back a chunk (see cycle())
  std::atomic<bool> lastCycleBusy_{false};
  std::map<std::string, bool> warned_;
  std::chrono::steady_clock::time_point lastStallCheck_;
  uint64_t publishedVersion_ = ~0ull;  // coordinator version last published to the registry
  std::map<std::string, std::vector<int>> missing_;  // pending names -> global ranks not yet in

  // Autotune: the set's first rank samples and decides (tuner_); every rank
  // applies what it publishes in the negotiation's words, in the same cycle.
  void tune(size_t bytes);
  void applyTuning(const uint64_t* words);
  std::optional<bool> cacheOn_;  // response cache on/off from the next cycle (guarded by cycleMu_)
  mutable std::mutex appliedMu_;  // what stats() reports of the transport's and cache's settings
  CommTuning applied_;
  bool cacheApplied_ = false;
  std::unique_ptr<autotune::Tuner> tuner_;
  std::optional<autotune::Settings> publish_;  // guarded by cycleMu_
  std::atomic<int64_t> cycleTimeUs_;
  std::chrono::steady_clock::time_point lastTuned_;
};

}  // namespace chorus
