#pragma once
// The autotuner's schedule, apart from any transport: it turns each negotiation
// cycle's traffic into samples of bytes per second, asks the Bayesian optimiser
// for the next settings to try, and ends on the best. One runs on the deciding
// rank of each process set; the controller publishes what it returns to the
// set's other ranks (all apply it from the same cycle).
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/autotune/gaussian_process.h"

namespace chorus::autotune {

// What is tuned: always the fusion threshold and cycle time; the others where
// the process set has them (see Space), else they read -1 (slot: 0).
struct Settings {
  int64_t fusionThresholdBytes = 128ll << 20;
  double cycleTimeMs = 1.0;
  int responseCache = -1;          // 1 on, 0 off
  int peerPath = -1;               // shared memory: 0 auto, 1 through caches, 2 through memory
  int64_t slotBytes = 0;           // shared memory: bytes per pipelined round
  int hierarchicalAllreduce = -1;  // 1 by hosts, 0 flat
  int hierarchicalAllgather = -1;
  bool operator==(const Settings& o) const {
    return fusionThresholdBytes == o.fusionThresholdBytes && cycleTimeMs == o.cycleTimeMs &&
           responseCache == o.responseCache && peerPath == o.peerPath && slotBytes == o.slotBytes &&
           hierarchicalAllreduce == o.hierarchicalAllreduce && hierarchicalAllgather == o.hierarchicalAllgather;
  }
};

// The dimensions a process set tunes beyond the two numbers: each one present
// adds a coordinate to the optimiser's points (categories split [0, 1] evenly).
struct Space {
  bool responseCache = false;
  bool peerPath = false;
  int64_t maxSlotBytes = 0;  // over 64 KiB: the slot is tuned from 64 KiB to this, in powers of two
  bool hierarchical = false;  // allreduce and allgather, each on or off
  int dims() const;
};

// Horovod's names: HOROVOD_AUTOTUNE_WARMUP_SAMPLES, _STEPS_PER_SAMPLE,
// _BAYES_OPT_MAX_SAMPLES, _GAUSSIAN_PROCESS_NOISE, HOROVOD_AUTOTUNE_LOG.
struct TunerOptions {
  int warmupSamples = 3;   // samples at the starting settings, not scored (caches, allocations warm up)
  int stepsPerSample = 10;  // cycles that moved data, per sample
  double minSampleSeconds = 0;  // and at least this long (whole training steps, whatever the cycle time)
  // Then the optimiser's pick and the starting settings alternate for this many
  // samples each, and the pick is kept only if it measured no slower (0: kept as is).
  int confirmSamples = 3;
  int maxSamples = 20;     // scored samples before the best is frozen
  double noise = 0.8;      // the Gaussian process's noise, on standardised scores
  std::string logPath;     // CSV of every sample and the chosen point ("" none)
  uint64_t seed = 1;
};

// The ranges searched, on log scales: fusion threshold 64 KiB-256 MiB, cycle time 0.1-25 ms.
Settings settingsAt(const Point& p, const Space& space = {});
Point pointOf(const Settings& s, const Space& space = {});

class Tuner {
 public:
  Tuner(TunerOptions options, Settings start, Space space = {});

  // One cycle: the bytes its collectives moved and the seconds since the last
  // call. Returns settings to apply from the next cycle when they change.
  std::optional<Settings> record(int64_t bytes, double seconds);
  bool done() const { return done_; }
  const Settings& current() const { return current_; }
  int scoredSamples() const { return opt_.samples(); }

 private:
  void log(const std::string& what, const Settings& s, double score);

  TunerOptions options_;
  Space space_;
  Settings current_;
  Settings start_, pick_;
  bool confirming_ = false;
  std::vector<double> pickScores_, startScores_;
  BayesianOptimizer opt_;
  int warmupLeft_;
  int steps_ = 0;
  int64_t bytes_ = 0;
  double seconds_ = 0;
  bool quietBefore_ = true;  // the last cycle moved no data
  bool done_ = false;
  std::ofstream log_;
};

}  // namespace chorus::autotune
