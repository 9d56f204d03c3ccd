#include "reduce/cpu_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "base/cpu_features.h"

namespace chorus {

#define CHORUS_DECLARE_ADAM(ns)                                                                         \
  namespace ns {                                                                                        \
  void adamBlock(const AdamCoefficients&, float*, const float*, float*, float*, size_t, void*, DataType); \
  }
CHORUS_DECLARE_ADAM(adam_generic)
CHORUS_DECLARE_ADAM(adam_avx2)
CHORUS_DECLARE_ADAM(adam_avx512)

namespace {
using Block = void (*)(const AdamCoefficients&, float*, const float*, float*, float*, size_t, void*, DataType);
struct Kernel {
  const char* name;
  Block block;
};

const Kernel& kernel() {
  static const Kernel k = [] {
    switch (cpuSimdLevel()) {
      case SimdLevel::kAvx512: return Kernel{"avx512", adam_avx512::adamBlock};
      case SimdLevel::kAvx2: return Kernel{"avx2", adam_avx2::adamBlock};
      case SimdLevel::kGeneric: break;
    }
    return Kernel{"generic", adam_generic::adamBlock};
  }();
  return k;
}
}  // namespace

const char* adamSimdLevel() { return kernel().name; }

AdamCoefficients adamCoefficients(const AdamHyper& h) {
  AdamCoefficients c;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.stepSize = h.lr / (1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta1), h.step)));
  c.invBias2Sqrt = 1.0f / std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta2), h.step)));
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
  // Blocks small enough to stay in cache between the passes of one block.
  constexpr size_t kBlock = 1 << 14;
  const Block block = kernel().block;
  const int64_t blocks = static_cast<int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t off = static_cast<size_t>(b) * kBlock;
    const size_t len = std::min(kBlock, n - off);
    void* low = lowPrecision ? static_cast<uint16_t*>(lowPrecision) + off : nullptr;
    block(h, params + off, grads + off, expAvg + off, expAvgSq + off, len, low, lowDtype);
  }
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
