// chorus's SIMD CPU Lion, Adagrad and LAMB kernels against float64 scalar updates
// written from the algorithms' definitions (DeepSpeed's CPU Lion and Adagrad,
// FusedLamb), over sizes that leave SIMD tails and span several blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "reduce/cpu_optimizer.h"
#include "reduce/half.h"

namespace chorus {
namespace {

struct Data {
  std::vector<float> p, g, m, v;
};

Data make(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  Data x;
  for (size_t i = 0; i < n; ++i) {
    x.p.push_back(d(gen));
    x.g.push_back(d(gen));
    x.m.push_back(0.1f * d(gen));
    x.v.push_back(std::abs(d(gen)));
  }
  return x;
}

class Sizes : public testing::TestWithParam<size_t> {};

TEST_P(Sizes, LionIsDeepSpeedsUpdate) {
  const size_t n = GetParam();
  Data x = make(n, 1);
  if (n) x.g[0] = x.m[0] = 0.0f;  // a zero blend moves by -lr, as DeepSpeed's copysign
  const double lr = 0.01, b1 = 0.9, b2 = 0.99, wd = 0.1, gs = 0.5;
  Data want = x;
  std::vector<uint16_t> low(n);
  cpuLionStep({static_cast<float>(lr), static_cast<float>(b1), static_cast<float>(b2),
               static_cast<float>(1 - lr * wd), static_cast<float>(gs)},
              x.p.data(), x.g.data(), x.m.data(), n, low.data(), DataType::kBFloat16);
  for (size_t i = 0; i < n; ++i) {
    const double g = double(want.g[i]) * gs, blend = b1 * want.m[i] + (1 - b1) * g;
    const double p = want.p[i] * (1 - lr * wd) - std::copysign(lr, blend);
    ASSERT_NEAR(x.p[i], p, 1e-6) << i;
    ASSERT_NEAR(x.m[i], b2 * want.m[i] + (1 - b2) * g, 1e-6) << i;
    ASSERT_EQ(low[i], floatToBf16(x.p[i]));
  }
}

TEST_P(Sizes, AdagradIsTorchsUpdate) {
  const size_t n = GetParam();
  Data x = make(n, 2);
  const double lr = 0.05, eps = 1e-10, wd = 0.01, gs = 2.0;
  Data want = x;
  cpuAdagradStep({static_cast<float>(lr), static_cast<float>(eps), static_cast<float>(wd), static_cast<float>(gs)},
                 x.p.data(), x.g.data(), x.v.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double g = double(want.g[i]) * gs + wd * want.p[i], s = want.v[i] + g * g;
    ASSERT_NEAR(x.v[i], s, 1e-5 * s) << i;
    ASSERT_NEAR(x.p[i], want.p[i] - lr * g / (std::sqrt(s) + eps), 1e-6) << i;
  }
}

TEST_P(Sizes, LambTrustsTheWholeTensor) {
  const size_t n = GetParam();
  Data x = make(n, 3);
  LambHyper h;
  h.lr = 0.02f;
  h.weightDecay = 0.01f;
  h.step = 3;
  h.gradScale = 0.25f;
  const LambCoefficients c = lambCoefficients(h);
  Data want = x;
  // In two pieces, as a ZeRO partition splits a parameter: the norms add up before the update.
  const size_t half = n / 2;
  double wsq = 0, usq = 0;
  cpuLambMoments(c, x.p.data(), x.g.data(), x.m.data(), x.v.data(), half, &wsq, &usq);
  cpuLambMoments(c, x.p.data() + half, x.g.data() + half, x.m.data() + half, x.v.data() + half, n - half, &wsq, &usq);
  const float trust = lambTrust(c, wsq, usq);
  cpuLambApply(c, trust, x.p.data(), x.m.data(), x.v.data(), n);

  double w2 = 0, u2 = 0;
  std::vector<double> u(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    const double g = double(want.g[i]) * h.gradScale;
    m[i] = h.beta1 * want.m[i] + (1 - h.beta1) * g;
    v[i] = h.beta2 * want.v[i] + (1 - h.beta2) * g * g;
    u[i] = m[i] / (std::sqrt(v[i]) + h.eps) + h.weightDecay * want.p[i];
    w2 += double(want.p[i]) * want.p[i];
    u2 += u[i] * u[i];
  }
  const double ratio = (w2 > 0 && u2 > 0) ? std::clamp(std::sqrt(w2) / std::sqrt(u2), 0.01, 10.0) : 1.0;
  const double step = h.lr * std::sqrt(1 - std::pow(h.beta2, h.step)) / (1 - std::pow(h.beta1, h.step));
  ASSERT_NEAR(trust, ratio, 1e-5 * ratio);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(x.m[i], m[i], 1e-6) << i;
    ASSERT_NEAR(x.v[i], v[i], 1e-5 * v[i] + 1e-7) << i;
    ASSERT_NEAR(x.p[i], want.p[i] - step * ratio * u[i], 2e-5) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(CpuOptimizers, Sizes, testing::Values(0, 1, 17, 40001));

}  // namespace
}  // namespace chorus
