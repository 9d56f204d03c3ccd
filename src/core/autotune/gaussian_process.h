#pragma once
// Bayesian optimisation for the autotuner: a Gaussian process over settings
// scaled to [0,1]^d, and expected improvement to pick the next sample.
#include <cstdint>
#include <random>
#include <vector>

#include <Eigen/Dense>

namespace chorus::autotune {

using Point = std::vector<double>;

// Gaussian-process regression with a squared-exponential kernel. Scores are
// standardised; the length scale is the one of a small grid that maximises the
// data's marginal likelihood, so that noisy throughput samples do not need a
// hand-set scale.
class GaussianProcess {
 public:
  explicit GaussianProcess(double noise = 1e-2) : noise_(noise) {}

  void fit(const std::vector<Point>& x, const std::vector<double>& y);
  // Posterior mean and standard deviation at p, in the scores' own units.
  void predict(const Point& p, double* mean, double* stddev) const;
  double lengthScale() const { return length_; }

 private:
  double kernel(const Point& a, const Point& b, double length) const;
  // Log marginal likelihood of the standardised scores under `length`; fills the factors.
  double logLikelihood(double length, Eigen::LLT<Eigen::MatrixXd>* llt, Eigen::VectorXd* alpha) const;

  double noise_;
  double length_ = 0.3;
  std::vector<Point> x_;
  Eigen::VectorXd y_;  // standardised
  double yMean_ = 0, yScale_ = 1;
  Eigen::LLT<Eigen::MatrixXd> llt_;
  Eigen::VectorXd alpha_;
};

// Expected improvement over `best` of a point whose score is N(mean, stddev^2),
// for maximisation; xi trades exploration for exploitation.
double expectedImprovement(double mean, double stddev, double best, double xi = 0.01);

// Maximises an unknown, noisy function of d settings in [0,1] from samples:
// a few random points first, then the maximiser of expected improvement.
class BayesianOptimizer {
 public:
  // noise: the Gaussian process's, on standardised scores (larger: smoother).
  BayesianOptimizer(int dims, uint64_t seed, int randomStarts = 3, double noise = 1e-2);

  void addSample(const Point& x, double score);
  // The next point to sample.
  Point next();
  // The sampled point of the highest posterior mean (noise-robust), and that mean.
  Point best(double* score = nullptr) const;
  int samples() const { return static_cast<int>(x_.size()); }

 private:
  Point randomPoint();

  int dims_;
  int randomStarts_;
  std::mt19937_64 rng_;
  std::vector<Point> x_;
  std::vector<double> y_;
  GaussianProcess gp_;
};

}  // namespace chorus::autotune
