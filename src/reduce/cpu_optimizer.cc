#include "reduce/cpu_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "base/cpu_features.h"

namespace chorus {

#define CHORUS_DECLARE_ADAM(ns)                                                                               \
  namespace ns {                                                                                              \
  void adamBlock(const AdamCoefficients&, float*, const float*, float*, float*, size_t, void*, DataType);       \
  void lionBlock(const LionCoefficients&, float*, const float*, float*, size_t, void*, DataType);              \
  void adagradBlock(const AdagradCoefficients&, float*, const float*, float*, size_t, void*, DataType);        \
  void lambMomentsBlock(const LambCoefficients&, const float*, const float*, float*, float*, size_t, double*,  \
                        double*);                                                                             \
  void lambApplyBlock(const LambCoefficients&, float, float*, const float*, const float*, size_t, void*,       \
                      DataType);                                                                              \
  }
CHORUS_DECLARE_ADAM(adam_generic)
CHORUS_DECLARE_ADAM(adam_avx2)
CHORUS_DECLARE_ADAM(adam_avx512)

namespace {
using Block = void (*)(const AdamCoefficients&, float*, const float*, float*, float*, size_t, void*, DataType);
struct Kernel {
  const char* name;
  Block block;
  decltype(&adam_generic::lionBlock) lion;
  decltype(&adam_generic::adagradBlock) adagrad;
  decltype(&adam_generic::lambMomentsBlock) lambMoments;
  decltype(&adam_generic::lambApplyBlock) lambApply;
};

#define CHORUS_KERNEL(name, ns) \
  Kernel { name, ns::adamBlock, ns::lionBlock, ns::adagradBlock, ns::lambMomentsBlock, ns::lambApplyBlock }

const Kernel& kernel() {
  static const Kernel k = [] {
    switch (cpuSimdLevel()) {
      case SimdLevel::kAvx512: return CHORUS_KERNEL("avx512", adam_avx512);
      case SimdLevel::kAvx2: return CHORUS_KERNEL("avx2", adam_avx2);
      case SimdLevel::kGeneric: break;
    }
    return CHORUS_KERNEL("generic", adam_generic);
  }();
  return k;
}

// Blocks small enough to stay in cache between the passes of one block.
constexpr size_t kBlock = 1 << 14;

// f(offset, length) over n elements in blocks, across OpenMP threads.
template <typename F>
void blocks(size_t n, F f) {
  const int64_t count = static_cast<int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < count; ++b) {
    const size_t off = static_cast<size_t>(b) * kBlock;
    f(off, std::min(kBlock, n - off));
  }
}

void* lowAt(void* low, size_t off) { return low ? static_cast<uint16_t*>(low) + off : nullptr; }
}  // namespace

const char* adamSimdLevel() { return kernel().name; }

AdamCoefficients adamCoefficients(const AdamHyper& h) {
  AdamCoefficients c;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.stepSize = h.lr;
  c.invBias2Sqrt = 1.0f;
  if (h.biasCorrection) {
    c.stepSize = h.lr / (1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta1), h.step)));
    c.invBias2Sqrt = 1.0f / std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta2), h.step)));
  }
  c.decay = h.adamw ? 1.0f - h.lr * h.weightDecay : 1.0f;
  c.l2 = h.adamw ? 0.0f : h.weightDecay;
  c.gradScale = h.gradScale;
  return c;
}

void cpuAdamStep(const AdamHyper& h, float* params, const float* grads, float* expAvg, float* expAvgSq, size_t n,
                 void* lowPrecision, DataType lowDtype) {
  cpuAdamStep(adamCoefficients(h), params, grads, expAvg, expAvgSq, n, lowPrecision, lowDtype);
}

void cpuAdamStep(const AdamCoefficients& h, float* params, const float* grads, float* expAvg, float* expAvgSq,
                 size_t n, void* lowPrecision, DataType lowDtype) {
  const Block block = kernel().block;
  blocks(n, [&](size_t off, size_t len) {
    block(h, params + off, grads + off, expAvg + off, expAvgSq + off, len, lowAt(lowPrecision, off), lowDtype);
  });
}

void cpuLionStep(const LionCoefficients& c, float* p, const float* g, float* m, size_t n, void* low, DataType lowDtype) {
  const auto f = kernel().lion;
  blocks(n, [&](size_t off, size_t len) { f(c, p + off, g + off, m + off, len, lowAt(low, off), lowDtype); });
}

void cpuAdagradStep(const AdagradCoefficients& c, float* p, const float* g, float* sum, size_t n, void* low,
                    DataType lowDtype) {
  const auto f = kernel().adagrad;
  blocks(n, [&](size_t off, size_t len) { f(c, p + off, g + off, sum + off, len, lowAt(low, off), lowDtype); });
}

LambCoefficients lambCoefficients(const LambHyper& h) {
  LambCoefficients c;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.decay = h.weightDecay;
  c.gradScale = h.gradScale;
  c.maxCoeff = h.maxCoeff;
  c.minCoeff = h.minCoeff;
  c.epsInsideSqrt = h.epsInsideSqrt;
  c.stepSize = h.lr;
  if (h.biasCorrection) {  // FusedLamb's: on the step size, not on the moments
    const double b1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
    const double b2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
    c.stepSize = static_cast<float>(h.lr * std::sqrt(b2) / b1);
  }
  return c;
}

void cpuLambMoments(const LambCoefficients& c, const float* p, const float* g, float* m, float* v, size_t n,
                    double* wsq, double* usq) {
  const auto f = kernel().lambMoments;
  double w = 0.0, u = 0.0;
  const int64_t count = static_cast<int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) reduction(+ : w, u)
  for (int64_t b = 0; b < count; ++b) {
    const size_t off = static_cast<size_t>(b) * kBlock;
    f(c, p + off, g + off, m + off, v + off, std::min(kBlock, n - off), &w, &u);
  }
  *wsq += w;
  *usq += u;
}

float lambTrust(const LambCoefficients& c, double wsq, double usq) {
  const double w = std::sqrt(wsq), u = std::sqrt(usq);
  if (w == 0.0 || u == 0.0) return 1.0f;
  return static_cast<float>(std::clamp(w / u, static_cast<double>(c.minCoeff), static_cast<double>(c.maxCoeff)));
}

void cpuLambApply(const LambCoefficients& c, float trust, float* p, const float* m, const float* v, size_t n,
                  void* low, DataType lowDtype) {
  const auto f = kernel().lambApply;
  blocks(n, [&](size_t off, size_t len) { f(c, trust, p + off, m + off, v + off, len, lowAt(low, off), lowDtype); });
}

void cpuSgdStep(const SgdCoefficients& c, float* p, const float* g, float* buf, size_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < static_cast<int64_t>(n); ++k) {
    float d = g[k] * c.gradScale + c.weightDecay * p[k];
    if (c.momentum != 0.0f) {
      const float b = c.first ? d : c.momentum * buf[k] + (1.0f - c.dampening) * d;
      buf[k] = b;
      d = c.nesterov ? d + c.momentum * b : b;
    }
    p[k] -= c.lr * d;
  }
}

}  // namespace chorus
