// The autotuner's Bayesian optimisation: the Gaussian process fits what it saw,
// expected improvement matches its closed form, and the optimiser finds the
// maximum of known functions, noisy ones included.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/autotune/gaussian_process.h"

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

}  // namespace
}  // namespace chorus::autotune
