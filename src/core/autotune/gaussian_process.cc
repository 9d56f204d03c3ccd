#include "core/autotune/gaussian_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace chorus::autotune {

double GaussianProcess::kernel(const Point& a, const Point& b, double length) const {
  double d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return std::exp(-0.5 * d2 / (length * length));
}

double GaussianProcess::logLikelihood(double length, Eigen::LLT<Eigen::MatrixXd>* llt,
                                      Eigen::VectorXd* alpha) const {
  const int n = static_cast<int>(x_.size());
  Eigen::MatrixXd k(n, n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) k(i, j) = k(j, i) = kernel(x_[i], x_[j], length);
  k.diagonal().array() += noise_;
  llt->compute(k);
  if (llt->info() != Eigen::Success) return -std::numeric_limits<double>::infinity();
  *alpha = llt->solve(y_);
  const Eigen::MatrixXd l = llt->matrixL();
  return -0.5 * y_.dot(*alpha) - l.diagonal().array().log().sum() - 0.5 * n * std::log(2 * M_PI);
}

void GaussianProcess::fit(const std::vector<Point>& x, const std::vector<double>& y) {
  if (x.empty() || x.size() != y.size()) throw std::invalid_argument("GaussianProcess::fit: no samples, or x/y differ");
  x_ = x;
  const int n = static_cast<int>(y.size());
  yMean_ = 0;
  for (double v : y) yMean_ += v / n;
  double var = 0;
  for (double v : y) var += (v - yMean_) * (v - yMean_) / n;
  yScale_ = var > 0 ? std::sqrt(var) : 1.0;
  y_.resize(n);
  for (int i = 0; i < n; ++i) y_(i) = (y[i] - yMean_) / yScale_;
  double bestLl = -std::numeric_limits<double>::infinity();
  for (double length : {0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2}) {
    Eigen::LLT<Eigen::MatrixXd> llt;
    Eigen::VectorXd alpha;
    const double ll = logLikelihood(length, &llt, &alpha);
    if (ll > bestLl) {
      bestLl = ll;
      length_ = length;
      llt_ = llt;
      alpha_ = alpha;
    }
  }
  if (!std::isfinite(bestLl)) throw std::runtime_error("GaussianProcess::fit: the kernel matrix is not positive definite");
}

void GaussianProcess::predict(const Point& p, double* mean, double* stddev) const {
  const int n = static_cast<int>(x_.size());
  Eigen::VectorXd ks(n);
  for (int i = 0; i < n; ++i) ks(i) = kernel(p, x_[i], length_);
  const Eigen::VectorXd v = llt_.matrixL().solve(ks);
  const double var = std::max(1.0 - v.squaredNorm(), 0.0);  // k(p, p) = 1
  *mean = yMean_ + yScale_ * ks.dot(alpha_);
  *stddev = yScale_ * std::sqrt(var);
}

double expectedImprovement(double mean, double stddev, double best, double xi) {
  if (stddev <= 0) return std::max(mean - best - xi, 0.0);
  const double z = (mean - best - xi) / stddev;
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  return (mean - best - xi) * cdf + stddev * pdf;
}

BayesianOptimizer::BayesianOptimizer(int dims, uint64_t seed, int randomStarts, double noise)
    : dims_(dims), randomStarts_(std::max(randomStarts, 1)), rng_(seed), gp_(noise) {
  if (dims < 1) throw std::invalid_argument("BayesianOptimizer needs at least one dimension");
}

Point BayesianOptimizer::randomPoint() {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Point p(dims_);
  for (double& v : p) v = u(rng_);
  return p;
}

void BayesianOptimizer::addSample(const Point& x, double score) {
  if (static_cast<int>(x.size()) != dims_) throw std::invalid_argument("BayesianOptimizer: wrong number of dimensions");
  x_.push_back(x);
  y_.push_back(score);
}

Point BayesianOptimizer::next() {
  if (samples() < randomStarts_) return randomPoint();
  gp_.fit(x_, y_);
  const double best = *std::max_element(y_.begin(), y_.end());
  // Expected improvement is cheap to evaluate: random candidates, then the best
  // few refined by shrinking random steps around them.
  auto ei = [&](const Point& p) {
    double m, s;
    gp_.predict(p, &m, &s);
    return expectedImprovement(m, s, best);
  };
  Point top = randomPoint();
  double topEi = ei(top);
  for (int i = 0; i < 500 * dims_; ++i) {
    Point p = randomPoint();
    const double e = ei(p);
    if (e > topEi) top = p, topEi = e;
  }
  std::normal_distribution<double> step(0.0, 1.0);
  for (double radius = 0.1; radius > 0.005; radius *= 0.7) {
    for (int i = 0; i < 20; ++i) {
      Point p = top;
      for (double& v : p) v = std::clamp(v + radius * step(rng_), 0.0, 1.0);
      const double e = ei(p);
      if (e > topEi) top = p, topEi = e;
    }
  }
  return top;
}

Point BayesianOptimizer::best(double* score) const {
  if (x_.empty()) throw std::logic_error("BayesianOptimizer::best: no samples yet");
  GaussianProcess gp = gp_;
  gp.fit(x_, y_);
  size_t at = 0;
  double top = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < x_.size(); ++i) {
    double m, s;
    gp.predict(x_[i], &m, &s);
    if (m > top) top = m, at = i;
  }
  if (score) *score = top;
  return x_[at];
}

}  // namespace chorus::autotune
