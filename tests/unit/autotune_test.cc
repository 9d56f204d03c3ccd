// The autotuner's Bayesian optimisation: the Gaussian process fits what it saw,
// expected improvement matches its closed form, and the optimiser finds the
// maximum of known functions, noisy ones included.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/autotune/gaussian_process.h"
#include "chorus/error.h"
#include "core/autotune/tuner.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace chorus::autotune {
namespace {

TEST(GaussianProcess, InterpolatesItsSamplesAndIsUnsureFarFromThem) {
  std::vector<Point> x;
  std::vector<double> y;
  for (double v : {0.1, 0.3, 0.5, 0.7}) {
    x.push_back({v});
    y.push_back(std::sin(6 * v));
  }
  GaussianProcess gp(1e-6);
  gp.fit(x, y);
  for (size_t i = 0; i < x.size(); ++i) {
    double m, s;
    gp.predict(x[i], &m, &s);
    EXPECT_NEAR(m, y[i], 1e-3);
    EXPECT_LT(s, 0.05);
  }
  double mNear, sNear, mFar, sFar;
  gp.predict({0.4}, &mNear, &sNear);
  gp.predict({1.0}, &mFar, &sFar);
  EXPECT_GT(sFar, sNear);
}

TEST(ExpectedImprovement, MatchesItsClosedForm) {
  // At mean == best, xi = 0: stddev * phi(0).
  EXPECT_NEAR(expectedImprovement(1.0, 2.0, 1.0, 0.0), 2.0 / std::sqrt(2 * M_PI), 1e-12);
  // Certain points: the plain improvement.
  EXPECT_DOUBLE_EQ(expectedImprovement(3.0, 0.0, 1.0, 0.0), 2.0);
  EXPECT_DOUBLE_EQ(expectedImprovement(0.5, 0.0, 1.0, 0.0), 0.0);
  // z = 1: (m - b) Phi(1) + s phi(1), with Phi(1) = 0.841344746..., phi(1) = 0.241970724...
  EXPECT_NEAR(expectedImprovement(2.0, 1.0, 1.0, 0.0), 0.8413447460685429 + 0.24197072451914337, 1e-9);
  // More uncertainty, more expected improvement below the best.
  EXPECT_GT(expectedImprovement(0.0, 2.0, 1.0), expectedImprovement(0.0, 1.0, 1.0));
}

double bowl(const Point& p) { return -std::pow(p[0] - 0.7, 2) - std::pow(p[1] - 0.2, 2); }

TEST(BayesianOptimizer, FindsTheTopOfABowl) {
  BayesianOptimizer opt(2, 7);
  for (int i = 0; i < 25; ++i) {
    Point p = opt.next();
    opt.addSample(p, bowl(p));
  }
  double score;
  Point b = opt.best(&score);
  EXPECT_NEAR(b[0], 0.7, 0.1);
  EXPECT_NEAR(b[1], 0.2, 0.1);
  EXPECT_GT(bowl(b), -0.01);
}

TEST(BayesianOptimizer, BeatsRandomSearchOnANoisyFunctionWithTheSameBudget) {
  // Throughput-like: a ridge with a sharp optimum, 3% multiplicative noise.
  auto f = [](const Point& p) { return 100 * std::exp(-20 * std::pow(p[0] - 0.35, 2) - 5 * std::pow(p[1] - 0.8, 2)); };
  int wins = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 noise(seed * 1000);
    std::normal_distribution<double> n(1.0, 0.03);
    BayesianOptimizer opt(2, seed);
    for (int i = 0; i < 20; ++i) {
      Point p = opt.next();
      opt.addSample(p, f(p) * n(noise));
    }
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0, 1);
    double randomBest = 0;
    for (int i = 0; i < 20; ++i) randomBest = std::max(randomBest, f({u(rng), u(rng)}));
    const double found = f(opt.best());  // the true value where the optimiser settles
    EXPECT_GT(found, 80) << "seed " << seed;
    if (found >= randomBest) ++wins;
  }
  EXPECT_GE(wins, 4);
}

TEST(BayesianOptimizer, RefusesBadInput) {
  EXPECT_THROW(BayesianOptimizer(0, 1), std::invalid_argument);
  BayesianOptimizer opt(2, 1);
  EXPECT_THROW(opt.addSample({0.5}, 1.0), std::invalid_argument);
  EXPECT_THROW(opt.best(), std::logic_error);
}

TEST(Tuner, SettingsMapToPointsAndBack) {
  Settings defaults;
  EXPECT_EQ(settingsAt(pointOf(defaults)), defaults);
  Settings s{1 << 20, 5.0};
  EXPECT_EQ(settingsAt(pointOf(s)), s);
  EXPECT_EQ(settingsAt({0, 0}).fusionThresholdBytes, 64 << 10);
  EXPECT_EQ(settingsAt({1, 1}).fusionThresholdBytes, 256 << 20);
  EXPECT_DOUBLE_EQ(settingsAt({1, 1}).cycleTimeMs, 25.0);
  EXPECT_EQ(settingsAt({0.5, 0.5}).responseCache, -1);  // not in the space: not tuned
  // Every dimension: the categories and the slot's powers of two come back as they were.
  Space all{true, true, 1 << 20, true};
  EXPECT_EQ(all.dims(), 7);
  for (int cache : {0, 1})
    for (int path : {0, 1, 2})
      for (int64_t slot : {64 << 10, 256 << 10, 1 << 20}) {
        Settings t{4 << 20, 2.0, cache, path, slot, 1 - cache, cache};
        EXPECT_EQ(settingsAt(pointOf(t, all), all), t) << cache << " " << path << " " << slot;
      }
  EXPECT_EQ(settingsAt(Point(7, 1.0), all).slotBytes, 1 << 20);  // the segment's slot at most
  EXPECT_EQ(settingsAt(Point(7, 0.0), all).slotBytes, 64 << 10);
}

// Categories are tuned with the numbers: a job twice as fast with the cache off
// and through memory ends there.
TEST(Tuner, TunesCategoriesWithTheNumbers) {
  const Space space{true, true, 0, false};
  auto throughput = [](const Settings& s) {
    return 1e9 * (s.responseCache == 0 ? 2 : 1) * (s.peerPath == 2 ? 2 : 1) /
           (1 + std::pow(std::log2(s.fusionThresholdBytes / double(8 << 20)), 2) / 16);
  };
  TunerOptions o;
  o.warmupSamples = 0;
  o.stepsPerSample = 1;
  o.maxSamples = 24;
  Settings start{};
  start.responseCache = 1;
  start.peerPath = 0;
  Tuner t(o, start, space);
  while (!t.done()) t.record(1 << 20, (1 << 20) / throughput(t.current()));
  EXPECT_EQ(t.current().responseCache, 0);
  EXPECT_EQ(t.current().peerPath, 2);
  EXPECT_GT(throughput(t.current()), 2 * throughput(start));
}

// A job whose throughput depends on the settings as a known function: the tuner
// warms up, samples, ends on a setting near the best and writes every sample.
TEST(Tuner, ConvergesOnASyntheticJobAndLogsEverySample) {
  auto throughput = [](const Settings& s) {  // bytes/s, best at 8 MiB and 2 ms
    const Point p = pointOf(s), q = pointOf(Settings{8 << 20, 2.0});
    return 1e9 * std::exp(-8 * std::pow(p[0] - q[0], 2) - 8 * std::pow(p[1] - q[1], 2)) + 1e8;
  };
  const std::string path = "/tmp/chorus_tuner_test_" + std::to_string(::getpid()) + ".csv";
  TunerOptions o;
  o.warmupSamples = 2;
  o.stepsPerSample = 3;
  o.maxSamples = 18;
  o.logPath = path;
  Tuner t(o, Settings{});
  int applied = 0, cycles = 0;
  while (!t.done() && cycles < 10000) {
    const int64_t bytes = 4 << 20;
    // An idle cycle between busy ones counts its time but is not a step.
    EXPECT_FALSE(t.record(0, 1e-4).has_value());
    if (t.record(bytes, bytes / throughput(t.current()))) ++applied;
    ++cycles;
  }
  ASSERT_TRUE(t.done());
  EXPECT_EQ(t.scoredSamples(), 18);
  EXPECT_EQ(cycles, (2 + 18 + 2 * o.confirmSamples) * 3);  // warm-up, scored, the pick against the start
  EXPECT_GT(applied, 5);
  const double best = throughput(t.current()), top = throughput(Settings{8 << 20, 2.0});
  EXPECT_GT(best, 0.8 * top) << t.current().fusionThresholdBytes << " " << t.current().cycleTimeMs;
  EXPECT_GT(best, throughput(Settings{}));  // never ends below where it started
  EXPECT_FALSE(t.record(1 << 20, 1.0).has_value());  // frozen
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  EXPECT_EQ(text.rfind("sample,fusion_threshold_bytes,cycle_time_ms,response_cache,shm_peer_path,shm_slot_bytes,"
                       "hierarchical_allreduce,hierarchical_allgather,bytes_per_second\n",
                       0),
            0u);
  int warmups = 0, rows = 0, bests = 0;
  std::string line;
  std::istringstream lines(text);
  while (std::getline(lines, line)) {
    warmups += line.rfind("warmup,", 0) == 0;
    bests += line.rfind("best,", 0) == 0;
    rows += !line.empty() && std::isdigit(static_cast<unsigned char>(line[0]));
  }
  EXPECT_EQ(warmups, 2);
  EXPECT_EQ(rows, 18);
  EXPECT_EQ(bests, 1);
  std::remove(path.c_str());
}

// The optimiser's pick is measured again against the starting settings, and
// dropped when it is slower there (its good samples were luck).
TEST(Tuner, KeepsTheStartWhenThePickMeasuresSlowerInTheConfirmation) {
  TunerOptions o;
  o.warmupSamples = 0;
  o.stepsPerSample = 1;
  o.maxSamples = 6;
  o.confirmSamples = 3;
  const Settings start{};
  Tuner t(o, start);
  int confirmations = 0;
  while (!t.done()) {
    const bool confirming = t.scoredSamples() >= o.maxSamples;
    confirmations += confirming;
    // While the optimiser samples, anything but the start looks twice as fast; then half as fast.
    const double rate = t.current() == start ? 1e9 : confirming ? 0.5e9 : 2e9;
    t.record(1 << 20, (1 << 20) / rate);
  }
  EXPECT_EQ(confirmations, 2 * o.confirmSamples);
  EXPECT_EQ(t.current(), start);
}

// A timed sample spans at least minSampleSeconds and ends where traffic starts
// after a quiet cycle (a step's first gradients), which opens the next one.
TEST(Tuner, ATimedSampleHoldsWholeBursts) {
  TunerOptions o;
  o.warmupSamples = 0;
  o.stepsPerSample = 1;
  o.minSampleSeconds = 1.0;
  Tuner t(o, Settings{});
  auto step = [&] {  // a step: 0.3 s quiet, then two cycles of traffic
    t.record(0, 0.3);
    t.record(1 << 20, 0.01);
    t.record(1 << 20, 0.01);
  };
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(t.scoredSamples(), 0);  // 0.96 s
  t.record(0, 0.3);                 // 1.26 s, but no burst has started
  EXPECT_EQ(t.scoredSamples(), 0);
  t.record(1 << 20, 0.01);  // one starts: the sample of three whole steps ends before it
  EXPECT_EQ(t.scoredSamples(), 1);
  t.record(1 << 20, 0.01);
  for (int i = 0; i < 3; ++i) step();  // the next sample: mid-burst at 1 s...
  t.record(1 << 20, 0.5);               // ...and still in it at 1.5 s
  EXPECT_EQ(t.scoredSamples(), 1);
}

TEST(Tuner, RefusesBadOptions) {
  TunerOptions o;
  o.stepsPerSample = 0;
  EXPECT_THROW(Tuner(o, Settings{}), InvalidArgument);
  TunerOptions bad;
  bad.logPath = "/nonexistent/dir/log.csv";
  EXPECT_THROW(Tuner(bad, Settings{}), InvalidArgument);
}

}  // namespace
}  // namespace chorus::autotune
