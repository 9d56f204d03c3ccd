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

#include "core/autotune/gaussian_process.h"

namespace chorus::autotune {

// What is tuned.
struct Settings {
  int64_t fusionThresholdBytes = 128ll << 20;
  double cycleTimeMs = 1.0;
  bool operator==(const Settings& o) const {
    return fusionThresholdBytes == o.fusionThresholdBytes && cycleTimeMs == o.cycleTimeMs;
  }
};

// Horovod's names: HOROVOD_AUTOTUNE_WARMUP_SAMPLES, _STEPS_PER_SAMPLE,
// _BAYES_OPT_MAX_SAMPLES, _GAUSSIAN_PROCESS_NOISE, HOROVOD_AUTOTUNE_LOG.
struct TunerOptions {
  int warmupSamples = 3;   // samples at the starting settings, not scored (caches, allocations warm up)
  int stepsPerSample = 10;  // cycles that moved data, per sample
  int maxSamples = 20;     // scored samples before the best is frozen
  double noise = 0.8;      // the Gaussian process's noise, on standardised scores
  std::string logPath;     // CSV of every sample and the chosen point ("" none)
  uint64_t seed = 1;
};

// The ranges searched, on log scales: fusion threshold 64 KiB-256 MiB, cycle time 0.1-25 ms.
Settings settingsAt(const Point& p);
Point pointOf(const Settings& s);

class Tuner {
 public:
  Tuner(TunerOptions options, Settings start);

  // One cycle: the bytes its collectives moved and the seconds since the last
  // call. Returns settings to apply from the next cycle when they change.
  std::optional<Settings> record(int64_t bytes, double seconds);
  bool done() const { return done_; }
  const Settings& current() const { return current_; }
  int scoredSamples() const { return opt_.samples(); }

 private:
  void log(const std::string& what, const Settings& s, double score);

  TunerOptions options_;
  Settings current_;
  BayesianOptimizer opt_;
  int warmupLeft_;
  int steps_ = 0;
  int64_t bytes_ = 0;
  double seconds_ = 0;
  bool done_ = false;
  std::ofstream log_;
};

}  // namespace chorus::autotune
