#include "core/controller.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "chorus/error.h"
#include "base/logging.h"
#include "device/loader.h"

namespace chorus {

namespace {

using Clock = std::chrono::steady_clock;

// Thrown inside the loop when the members agreed to stop.
struct StopSignal {
  std::exception_ptr error;
};

bool cacheable(OpType t) { return t != OpType::kBarrier && t != OpType::kJoin; }

void setBit(uint64_t* words, int pos) { words[pos / 64] |= (1ull << (pos % 64)); }
void clearBit(uint64_t* words, int pos) { words[pos / 64] &= ~(1ull << (pos % 64)); }
bool testBit(const uint64_t* words, int pos) { return (words[pos / 64] >> (pos % 64)) & 1ull; }

// Calls fn(pos), in ascending order, for every position below capacity whose bit
// is clear in notHit or set in invalid.
template <typename Fn>
void forEachPosition(const uint64_t* notHit, const uint64_t* invalid, int words, int capacity, Fn&& fn) {
  for (int w = 0; w < words; ++w) {
    for (uint64_t bits = ~notHit[w] | invalid[w]; bits; bits &= bits - 1) {
      const int pos = w * 64 + __builtin_ctzll(bits);
      if (pos >= capacity) return;
      fn(pos);
    }
  }
}

// What rank `me` sends with the negotiation when the cached op r goes with it
// (its whole input; of a broadcast, the root's alone), or SIZE_MAX where r
// cannot go that way: a scaled input would have to be scaled first.
size_t payloadBytes(const Response& r, const Entry& e, int me) {
  if (r.onDevice) return SIZE_MAX;  // (CUDA memory: the host cannot read or write it)
  switch (r.type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      if (r.prescale != 1.0) return SIZE_MAX;
      break;
    case OpType::kBroadcast:
      if (me != r.root) return 0;
      break;
    case OpType::kAllgather:
    case OpType::kAlltoall: break;
    default: return SIZE_MAX;
  }
  return e.input.bytes();
}

constexpr uint64_t kFlagShutdown = 1;
constexpr size_t kTuneWords = 7;  // fusion, cycle, cache, peer path, slot, hierarchical allreduce, allgather
constexpr uint64_t kFlagStallShutdown = 2;
constexpr uint64_t kFlagWaitingAhead = 4;
// No thread of this rank waits on the set's ops: the rank can still submit.
constexpr uint64_t kFlagRunning = 8;
// This rank saw every rank blocked on stalled ops for CHORUS_BLOCKED_FAIL_SECONDS.
constexpr uint64_t kFlagFailBlocked = 16;
// Cycles in a row that may hold back a chunk for an op some rank waits on (a
// rank that never submits its part must not stop the chunked op for long).
constexpr int kMaxHeldChunks = 32;

}  // namespace

Controller::Controller(int32_t setId, std::vector<int> globalRanks, int globalRank,
                       std::unique_ptr<Communicator> comm, const Config& config,
                       std::unique_ptr<Communicator> control, std::shared_ptr<NameRegistry> registry,
                       std::shared_ptr<Timeline> timeline)
    : setId_(setId),
      globalRanks_(globalRanks),
      globalRank_(globalRank),
      comm_(std::move(comm)),
      control_(std::move(control)),
      config_(config),
      coordinator_(std::move(globalRanks), setId),
      cache_(config.cacheCapacity),
      registry_(std::move(registry)),
      executor_(*comm_, config.fusionThresholdBytes, [this](const std::string& name) { releaseName(name); },
                timeline.get(), setId),
      timeline_(std::move(timeline)),
      cycleTimeUs_(static_cast<int64_t>(config.cycleTimeMs * 1000)) {
  registry_->setMembers(setId_, globalRanks_);
  applied_ = comm_->tuning();
  cacheApplied_ = cache_.enabled();
  executor_.setProgressHook([this] { wakeIdleWaiters(); });
  DeviceSettings dev;
  dev.backend = [device = config_.device]() { return backendOrCuda(device); };
  dev.path.gpuOperations = config_.gpuOperations;
  dev.path.stageChunkBytes = config_.gpuStageChunkBytes;
  dev.path.timeoutSeconds = config_.timeoutSeconds;
  dev.host = config_.hostname;
  executor_.setDevice(std::move(dev));
  executor_.setChunkBytes(config_.preemptChunkBytes >= 0 ? config_.preemptChunkBytes
                                                         : static_cast<int64_t>(comm_->traits().preemptChunkBytes));
  if (config_.autotune && comm_->rank() == 0) {
    autotune::TunerOptions o;
    o.warmupSamples = config_.autotuneWarmupSamples;
    o.stepsPerSample = config_.autotuneStepsPerSample;
    o.maxSamples = config_.autotuneMaxSamples;
    o.noise = config_.autotuneNoise;
    o.minSampleSeconds = config_.autotuneSampleSeconds;
    o.seed = 1 + static_cast<uint64_t>(setId_);
    if (!config_.autotuneLog.empty()) o.logPath = config_.autotuneLog + (setId_ ? "." + std::to_string(setId_) : "");
    // Beyond the two numbers: what this set's transport has, unless a setting fixed it.
    const CommTuning t = comm_->tuning();
    autotune::Space space;
    autotune::Settings start{config_.fusionThresholdBytes, config_.cycleTimeMs};
    space.responseCache = config_.cacheCapacity > 0;
    if (space.responseCache) start.responseCache = 1;
    space.peerPath = t.peerPath >= 0 && config_.shmPeerPath == "auto";
    if (space.peerPath) start.peerPath = t.peerPath;
    space.maxSlotBytes = t.maxSlotBytes;
    if (t.maxSlotBytes > 0) start.slotBytes = t.slotBytes;
    space.hierarchical = t.hierarchicalAllreduce >= 0 && config_.hierarchicalAllreduce < 0 &&
                         config_.hierarchicalAllgather < 0;
    if (space.hierarchical) {
      start.hierarchicalAllreduce = t.hierarchicalAllreduce;
      start.hierarchicalAllgather = t.hierarchicalAllgather;
    }
    tuner_ = std::make_unique<autotune::Tuner>(o, start, space);
    lastTuned_ = Clock::now();
  }
  CycleDriver::Hooks hooks;
  hooks.run = [this](const std::function<bool()>& done) { return driveCycle(done); };
  hooks.lastLeft = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    // requests that arrived while callers drove, or chunks still to run
    if (wakePending_ || executor_.busy()) wake_.notify_all();
  };
  driver_ = std::make_shared<CycleDriver>(std::move(hooks));
}

void Controller::releaseName(const std::string& name) { registry_->release(name, setId_); }

Controller::~Controller() {
  requestShutdown();
  join();
  driver_->detach();
  registry_->forgetSet(setId_);
}

void Controller::start() {
  lastStallCheck_ = Clock::now();
  thread_ = std::thread([this] { loop(); });
}

void Controller::enqueue(std::vector<Entry> entries, bool wake) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) std::rethrow_exception(failure_);
    // A name is in flight on one set at a time (see NameRegistry), and once on it.
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string& name = entries[i].req.name;
      const int32_t other = registry_->claim(name, setId_);
      if (other < 0) continue;
      for (size_t j = 0; j < i; ++j) registry_->release(entries[j].req.name, setId_);
      if (other == setId_) {
        throw InvalidArgument("a collective named '" + name + "' is already in flight on process set " +
                              std::to_string(setId_) + "; names must be unique until the op completes");
      }
      throw InvalidArgument("a collective named '" + name + "' is in flight on process set " +
                            std::to_string(other) + "; a name may be in flight on one process set at a time");
    }
    for (auto& e : entries) incoming_.push_back(std::move(e));
    if (!wake) return;
    wakePending_ = true;
  }
  wake_.notify_all();
}

ProcessSetStats Controller::stats() const {
  ProcessSetStats s;
  s.cycles = cycles_;
  s.negotiatedOps = negotiated_;
  s.cachedOps = cached_;
  s.allreduceBatches = executor_.allreduceBatches();
  s.allreduceTensors = executor_.allreduceTensors();
  s.payloadOps = speculated_;
  s.fusionThresholdBytes = executor_.fusionThreshold();
  s.cycleTimeMs = cycleTimeUs_ / 1000.0;
  std::lock_guard<std::mutex> lock(appliedMu_);
  s.responseCache = cacheApplied_;
  s.shmPeerPath = applied_.peerPath;
  s.shmSlotBytes = applied_.slotBytes;
  s.hierarchicalAllreduce = applied_.hierarchicalAllreduce;
  s.hierarchicalAllgather = applied_.hierarchicalAllgather;
  s.gpuPath = executor_.gpuPath();
  s.gpuPathReason = executor_.gpuPathReason();
  s.ops = executor_.opStats();
  return s;
}

void Controller::requestShutdown() {
  shutdownRequested_ = true;
  wake_.notify_all();
}

void Controller::join() {
  if (thread_.joinable()) thread_.join();
}

void Controller::loop() {
  while (true) {
    const auto cycleTime = std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(cycleTimeUs_.load()));
    {
      // A new request starts the next cycle at once (low latency), except that over
      // an expensive transport a busy cycle is followed by the full cycle time, so
      // that a burst of requests (a backward pass) fuses into few collectives.
      // While callers wait in the set's ops they run the cycles (CycleDriver).
      std::unique_lock<std::mutex> lock(mu_);
      while (!stopped_ && !shutdownRequested_) {
        if (driver_->waiting() > 0) {
          wake_.wait_for(lock, cycleTime);
          continue;
        }
        if (executor_.busy()) break;  // chunks to run: at once
        const bool hold = lastCycleBusy_ && ctl().traits().batchesRequests;
        if (!hold && wakePending_) break;
        const Clock::time_point due{Clock::duration(lastCycleEnd_.load()) + cycleTime};
        if (Clock::now() >= due) break;
        wake_.wait_until(lock, due);
      }
    }
    std::lock_guard<std::mutex> cycleLock(cycleMu_);
    if (!runCycle()) return;
  }
}

bool Controller::runCycle() {
  if (stopped_) return false;
  std::exception_ptr err;
  inCycle_ = true;
  struct Ended {
    Controller* c;
    ~Ended() {
      c->inCycle_ = false;
      c->wakeIdleWaiters();
    }
  } ended{this};
  try {
    cycle();
    // The next timed cycle counts from here, where every rank left this one
    // together: timed from the start, the ranks' idle cycles would stay apart by
    // their start-up offset and the first to arrive would spin for it each time.
    lastCycleEnd_ = Clock::now().time_since_epoch().count();
    return true;
  } catch (const StopSignal& stop) {
    err = stop.error;
  } catch (...) {
    err = std::current_exception();
  }
  failAll(err);
  try {
    std::rethrow_exception(err);
  } catch (const ShutdownError&) {  // every rank agreed to stop: nobody waits on us
  } catch (...) {
    comm_->abort();  // this set failed here: its peers on this host and elsewhere fail now too
    if (control_) control_->abort();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  wake_.notify_all();  // the controller thread exits
  return false;
}

bool Controller::driveCycle(const std::function<bool()>& done) {
  std::unique_lock<std::mutex> cycleLock(cycleMu_, std::try_to_lock);
  if (!cycleLock.owns_lock()) {
    // The cycle under way may finish this op and go on (a chunk of a large op):
    // return as soon as it does rather than at the cycle's end.
    {
      std::unique_lock<std::mutex> lock(idleMu_);
      ++idleWaiters_;
      idleCv_.wait(lock, [&] { return done() || !inCycle_; });
      --idleWaiters_;
    }
    if (done()) return true;
    cycleLock.lock();
  }
  if (done()) return true;
  return runCycle();
}

// (seq_cst: a waiter counts itself before it reads inCycle_, the cycle clears
// inCycle_ before it reads the count, so one of them sees the other.)
void Controller::wakeIdleWaiters() {
  if (idleWaiters_ == 0) return;
  { std::lock_guard<std::mutex> lock(idleMu_); }
  idleCv_.notify_all();
}

// What the set's first rank published (see cycle()). The transport's take effect
// from the next collective; the cache's from the next cycle, whose bit layout
// is settled before this one ends.
void Controller::applyTuning(const uint64_t* w) {
  auto value = [&](int k) { return static_cast<int64_t>(w[k]) - 1; };  // -1: unchanged
  executor_.setFusionThreshold(value(0));
  cycleTimeUs_ = value(1);
  if (value(2) >= 0) cacheOn_ = value(2) > 0;
  CommTuning t;
  t.peerPath = static_cast<int>(value(3));
  t.slotBytes = std::max<int64_t>(value(4), 0);
  t.hierarchicalAllreduce = static_cast<int>(value(5));
  t.hierarchicalAllgather = static_cast<int>(value(6));
  comm_->setTuning(t);
  std::lock_guard<std::mutex> lock(appliedMu_);
  applied_ = comm_->tuning();
  if (cacheOn_) cacheApplied_ = *cacheOn_;
}

// The set's first rank: one cycle's traffic into the tuner; what it decides goes
// out with the next negotiation.
void Controller::tune(size_t bytes) {
  const auto now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - lastTuned_).count();
  lastTuned_ = now;
  if (auto next = tuner_->record(static_cast<int64_t>(bytes), seconds)) publish_ = next;
}

void Controller::failAll(std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_) failure_ = err;
    err = failure_;
    for (auto& e : incoming_) entries_.emplace(e.req.name, std::move(e));
    incoming_.clear();
  }
  for (auto& e : fresh_)  // a cycle that failed while it took them in (the rest were moved)
    if (e.work) entries_.emplace(e.req.name, std::move(e));
  fresh_.clear();
  auto release = [this](const std::string& name) { releaseName(name); };
  while (!entries_.empty()) finishEntry(entries_, entries_.begin(), release, err);
  cachedPending_.clear();
  executor_.drop();
  executor_.abortDevice();
}

void Controller::cycle() {
  const auto now = Clock::now();
  Timeline* tl = timeline_ && timeline_->active() ? timeline_.get() : nullptr;
  if (tl) tl->cycleStart();
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh_.swap(incoming_);  // (each keeps its capacity: no allocation per cycle)
    wakePending_ = false;
  }
  const int n = ctl().size();
  const int capacity = cache_.capacity();
  const int W = (capacity + 63) / 64;
  // Layout, all OR-reduced: [flags][request bytes per rank][invalid bits][~hit bits]
  // [speculated position + 1][its complement].
  const size_t specAt = 1 + n + 2 * W;
  std::vector<uint64_t>& words = words_;
  // With autotune, kTuneWords more: the settings the set's first rank publishes
  // (each +1; 0: not published or not tuned).
  const size_t tuneAt = specAt + 2;
  words.assign(tuneAt + (config_.autotune ? kTuneWords : 0), 0);
  if (publish_) {
    const autotune::Settings& p = *publish_;
    const int64_t values[kTuneWords] = {p.fusionThresholdBytes, std::llround(p.cycleTimeMs * 1000), p.responseCache,
                                        p.peerPath, p.slotBytes > 0 ? p.slotBytes : -1, p.hierarchicalAllreduce,
                                        p.hierarchicalAllgather};
    for (size_t k = 0; k < kTuneWords; ++k) words[tuneAt + k] = values[k] < 0 ? 0 : static_cast<uint64_t>(values[k]) + 1;
    publish_.reset();
  }
  uint64_t* invalid = words.data() + 1 + n;
  uint64_t* notHit = invalid + W;
  std::fill(notHit, notHit + W, ~0ull);

  if (cacheOn_ && *cacheOn_ != cache_.enabled()) cache_.setEnabled(*cacheOn_);  // (autotune, see applyTuning)
  cacheOn_.reset();
  std::vector<Request> uncached;
  uncached.swap(resend_);
  const bool bypass = !cache_.enabled() || coordinator_.anyJoined();
  if (bypass) {
    for (const auto& [pos, e] : cachedPending_) uncached.push_back(e->second.req);
    cachedPending_.clear();
  }
  for (auto& e : fresh_) {
    const Request& req = e.req;
    if (tl) tl->negotiateStart(req.name, req.type);
    int pos = -1;
    auto look = bypass || !cacheable(req.type) ? ResponseCache::Lookup::kMiss : cache_.lookup(req, &pos);
    if (look != ResponseCache::Lookup::kHit) {
      if (look == ResponseCache::Lookup::kStale) setBit(invalid, pos);
      uncached.push_back(req);
    }
    auto it = entries_.emplace(req.name, std::move(e)).first;  // the key is copied before e moves
    if (look == ResponseCache::Lookup::kHit) cachedPending_[pos] = &*it;  // (entries_' elements stay put)
  }
  fresh_.clear();
  const bool stallCheck = !config_.stallCheckDisable && config_.stallCheckSeconds > 0;
  // Once every rank has been blocked a while, all waiting cached requests go
  // through the coordinator (see watchBlocked).
  const bool blockedLong = blockedSince_ && config_.blockedFailSeconds > 0 &&
                           std::chrono::duration<double>(now - *blockedSince_).count() > config_.blockedFailSeconds / 2;
  for (const auto& [pos, e] : cachedPending_) {
    clearBit(notHit, pos);
    // A cached request others have not matched for long goes through the
    // coordinator, which knows which ranks are missing.
    double waited = std::chrono::duration<double>(now - e->second.enqueued).count();
    if ((stallCheck && waited > config_.stallCheckSeconds / 2) || blockedLong) setBit(invalid, pos);
  }
  for (auto& q : uncached) {
    q.ageMs = std::chrono::duration_cast<std::chrono::milliseconds>(now - entries_.at(q.name).enqueued).count();
  }
  // Markers go first: one posted before this rank's next use of the same name
  // must stand for the earlier use.
  std::vector<Request> markers;
  for (auto& [name, other] : registry_->takeMarkers(setId_)) {
    Request marker;
    marker.type = OpType::kBarrier;
    marker.name = name;
    marker.conflictSet = other;
    markers.push_back(std::move(marker));
  }
  uncached.insert(uncached.begin(), markers.begin(), markers.end());
  ByteWriter mine;
  if (!uncached.empty()) writeRequests(uncached, mine);
  words[1 + ctl().rank()] = mine.data().size();
  words[0] = (shutdownRequested_ ? kFlagShutdown : 0) | (stallShutdown_ ? kFlagStallShutdown : 0) |
             (driver_->waiting() == 0 && driver_->parked() == 0 ? kFlagRunning : 0) | (failBlocked_ ? kFlagFailBlocked : 0);
  // An op of mine that outranks the chunked work is waiting for the others: the
  // next chunk waits a few cycles for them, rather than the op for the chunk.
  if (executor_.busy()) {
    const int32_t queued = executor_.queuedPriority();
    bool ahead = false;
    for (const auto& [pos, e] : cachedPending_) ahead |= e->second.req.priority > queued;
    for (const auto& q : uncached) ahead |= q.conflictSet < 0 && q.priority > queued;
    if (ahead) words[0] |= kFlagWaitingAhead;
  }

  // A lone cached small op travels with the negotiation: one round for the op
  // instead of two or more. Used only where every rank sent the same one (each
  // sends x and ~x: the ORs are complements of each other only if all x agree).
  const EntryTable::value_type* spec = nullptr;
  size_t specBytes = 0;
  NegotiationPayload* carrier = ctl().negotiationPayload();
  if (carrier && !bypass && uncached.empty() && cachedPending_.size() == 1 && &ctl() == comm_.get()) {
    const auto& [pos, e] = *cachedPending_.begin();
    const size_t bytes = payloadBytes(cache_.response(pos), e->second, comm_->rank());
    const size_t room = carrier->payloadCapacity(words.size());
    // It runs ahead of queued work: only where it outranks all of it.
    const bool first = cache_.response(pos).priority > executor_.queuedPriority();
    if (room > 0 && bytes <= room && first) {  // (0: a transport that carries none, even for an empty op)
      spec = e;
      specBytes = bytes;
      words[specAt] = static_cast<uint64_t>(pos) + 1;
    }
  }
  words[specAt + 1] = ~words[specAt];
  if (spec) carrier->allreduceBitsOrWithPayload(words.data(), words.size(), spec->second.input.data, specBytes);
  else ctl().allreduceBitsOr(words.data(), words.size());
  const bool specAgreed = words[specAt] != 0 && words[specAt] == ~words[specAt + 1];
  if (config_.autotune && words[tuneAt] != 0) applyTuning(words.data() + tuneAt);  // every rank, this cycle

  if (words[0] & kFlagShutdown) {
    throw StopSignal{std::make_exception_ptr(
        ShutdownError("process set " + std::to_string(setId_) + " was shut down"))};
  }
  if (words[0] & kFlagStallShutdown) {
    std::ostringstream os;
    os << "process set " << setId_ << " shut down after ops stalled for more than "
       << config_.stallShutdownSeconds << " s (CHORUS_STALL_SHUTDOWN_TIME_SECONDS)";
    for (const auto& s : coordinator_.stalls(now, 0)) {
      os << "; '" << s.name << "' missing ranks [";
      for (size_t i = 0; i < s.missingRanks.size(); ++i) os << (i ? ", " : "") << s.missingRanks[i];
      os << "]";
    }
    throw StopSignal{std::make_exception_ptr(StallError(os.str()))};
  }
  watchBlocked(words[0], now);

  // Ready on every rank from the cache, in position order (the same everywhere).
  // Only the positions hit or invalidated somewhere are visited (a cycle must not
  // cost in proportion to the cache's capacity).
  // ready_[0, nReady): its elements are assigned over, so that their strings and
  // shapes keep their storage from cycle to cycle.
  size_t nReady = 0;
  auto pushReady = [&](auto&& r) {
    if (nReady == ready_.size()) ready_.push_back(std::forward<decltype(r)>(r));
    else ready_[nReady] = std::forward<decltype(r)>(r);
    ++nReady;
  };
  forEachPosition(notHit, invalid, W, capacity, [&](int pos) {
    if (!testBit(notHit, pos)) {
      pushReady(cache_.response(pos));
      cache_.touch(pos);
      ++cached_;
      cachedPending_.erase(pos);
    } else if (testBit(invalid, pos)) {
      auto it = cachedPending_.find(pos);
      if (it != cachedPending_.end()) {
        resend_.push_back(it->second->second.req);
        cachedPending_.erase(it);
      }
      cache_.erase(pos);
    }
  });

  // Negotiate the new requests: every rank feeds every rank's list to its coordinator.
  std::vector<size_t>& sizes = sizes_;
  sizes.assign(n, 0);
  size_t total = 0;
  for (int r = 0; r < n; ++r) total += sizes[r] = static_cast<size_t>(words[1 + r]);
  if (total > 0) {
    std::vector<char> all(total);
    ctl().allgatherv(mine.data().data(), all.data(), sizes);
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      if (sizes[r] > 0) {
        ByteReader reader(all.data() + off, sizes[r]);
        for (const auto& q : readRequests(reader)) {
          if (tl && q.conflictSet < 0) {  // (conflict markers are not the tensor's own requests)
            tl->negotiateStart(q.name, q.type);
            tl->rankReady(q.name, globalRanks_[r]);
          }
          coordinator_.submit(r, q, now);
        }
      }
      off += sizes[r];
    }
  }
  detectConflicts();
  for (auto& resp : coordinator_.takeReady()) {
    if (!resp.conflictSets.empty()) {
      // Where this rank took part with a marker, its entry of that name (if any)
      // is a newer use: leave it alone.
      const auto& m = resp.markedRanks;
      if (std::find(m.begin(), m.end(), comm_->rank()) != m.end()) continue;
      // The other set of the conflict must fail too: this rank's own request was
      // here, so its marker stands for its part there (unless it sent one already).
      for (int32_t other : resp.conflictSets)
        if (other != setId_ && registry_->isMember(other, globalRank_)) registry_->postMarker(other, resp.name, setId_);
    }
    if (resp.errorKind == ErrorKind::kNone && !resp.involvesJoined && cacheable(resp.type)) {
      auto it = entries_.find(resp.name);
      if (it != entries_.end()) {
        int evicted = cache_.put(resp, it->second.req);
        auto pend = cachedPending_.find(evicted);
        if (evicted >= 0 && pend != cachedPending_.end()) {
          resend_.push_back(pend->second->second.req);
          cachedPending_.erase(pend);
        }
      }
    }
    ++negotiated_;
    pushReady(std::move(resp));
  }
  const auto ready = ready_.begin(), readyEnd = ready + static_cast<std::ptrdiff_t>(nReady);
  if (nReady > 1)  // (stable_sort allocates a buffer even for one element)
    std::stable_sort(ready, readyEnd, [](const Response& a, const Response& b) { return a.priority > b.priority; });
  // The same on every rank: the words are, and so are the cache and the coordinator.
  const bool fromPayload = specAgreed && total == 0 && nReady == 1 && ready->errorKind == ErrorKind::kNone &&
                           spec && ready->name == spec->first;
  if (fromPayload) ++speculated_;
  if (tl)
    for (auto r = ready; r != readyEnd; ++r) tl->negotiateEnd(r->name);
  const bool hold = (words[0] & kFlagWaitingAhead) && heldChunks_ < kMaxHeldChunks;
  heldChunks_ = hold ? heldChunks_ + 1 : 0;
  executor_.execute(ready_.data(), nReady, entries_, fromPayload, hold);
  lastCycleBusy_ = nReady > 0 || total > 0;
  if (tuner_) {
    size_t bytes = 0;
    for (auto r = ready; r != readyEnd; ++r)
      if (r->errorKind == ErrorKind::kNone) bytes += r->bytes();
    tune(bytes);
  }
  ++cycles_;

  if (stallCheck && now - lastStallCheck_ > std::chrono::seconds(1)) {
    lastStallCheck_ = now;
    inspectStalls(now);
  }
}

// A name that peers submitted here and that this rank has in flight on another set
// S', while S' waits for some of those peers, can never complete: this rank cannot
// submit it here until S' completes, and those peers cannot submit it on S' until
// this set does. This rank's marker stands for its part here; once every
// member has taken part the set fails the name everywhere (see Coordinator).
void Controller::detectConflicts() {
  if (!registry_->severalSets()) return;
  if (coordinator_.version() != publishedVersion_) {
    publishedVersion_ = coordinator_.version();
    missing_ = coordinator_.missingByName();
    registry_->publishMissing(setId_, missing_);
  }
  auto absent = [](const std::vector<int>& ranks, int g) { return std::find(ranks.begin(), ranks.end(), g) == ranks.end(); };
  for (const auto& [name, miss] : missing_) {
    if (absent(miss, globalRank_)) continue;  // not waiting for this rank
    const int32_t other = registry_->setOf(name);
    if (other < 0 || other == setId_) continue;
    // A cycle: a rank that submitted the name here is one that set `other` waits for.
    const std::vector<int> blocked = registry_->missing(other, name);
    bool cycle = false;
    for (int g : globalRanks_) cycle |= absent(miss, g) && !absent(blocked, g);
    if (!cycle) continue;
    registry_->postMarker(setId_, name, other);
  }
}

// Ranks on different code paths: every rank waits on the set's ops (none can
// submit another) while ops stay pending that some ranks never submitted. After
// CHORUS_BLOCKED_FAIL_SECONDS a rank says so in its flags; in the cycle where
// any rank said it, every rank fails those ops at once (their coordinators hold
// the same table), and the set goes on.
void Controller::watchBlocked(uint64_t flags, Clock::time_point now) {
  if (flags & kFlagFailBlocked) {
    std::ostringstream why;
    why << "every rank of process set " << setId_ << " waited more than " << config_.blockedFailSeconds
        << " s on ops that other ranks never submitted (the ranks run different code paths; "
           "CHORUS_BLOCKED_FAIL_SECONDS)";
    coordinator_.failPending(why.str());
    blockedSince_.reset();
    failBlocked_ = false;
    return;
  }
  if (config_.blockedFailSeconds <= 0 || (flags & kFlagRunning)) {
    blockedSince_.reset();
    failBlocked_ = false;
    return;
  }
  if (!blockedSince_) blockedSince_ = now;
  failBlocked_ = std::chrono::duration<double>(now - *blockedSince_).count() >= config_.blockedFailSeconds &&
                 !coordinator_.stalls(now, 0).empty();
}

void Controller::inspectStalls(Clock::time_point now) {
  // A shutdown time under the warning time still applies: look that far back.
  double olderThan = config_.stallCheckSeconds;
  if (config_.stallShutdownSeconds > 0) olderThan = std::min(olderThan, config_.stallShutdownSeconds);
  auto stalls = coordinator_.stalls(now, olderThan);
  if (stalls.empty()) return;
  if (comm_->rank() == 0) {
    std::ostringstream os;
    bool any = false;
    for (const auto& s : stalls) {
      if (s.seconds < config_.stallCheckSeconds || warned_[s.name]) continue;
      warned_[s.name] = true;
      any = true;
      os << "\n  '" << s.name << "' waited " << static_cast<int>(s.seconds)
         << " s; ranks that have not submitted it: [";
      for (size_t i = 0; i < s.missingRanks.size(); ++i) os << (i ? ", " : "") << s.missingRanks[i];
      os << "]";
    }
    if (any) {
      CHORUS_WARN(globalRank_, "Stalled ops on process set "
                                   << setId_ << ": some ranks submitted these more than "
                                   << config_.stallCheckSeconds
                                   << " s ago and others have not; a rank may be stuck or the "
                                      "ranks may run different code paths."
                                   << os.str());
    }
  }
  if (config_.stallShutdownSeconds > 0) {
    for (const auto& s : stalls)
      if (s.seconds >= config_.stallShutdownSeconds) stallShutdown_ = true;
  }
}

}  // namespace chorus
