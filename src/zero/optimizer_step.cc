#include "zero/optimizer_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "reduce/half.h"
#include "zero/cpu_adam.h"

namespace chorus::zero {

void toFloat(float* dst, const void* src, DataType dtype, size_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (dtype == DataType::kFloat32) {
    std::memcpy(dst, src, n * 4);
  } else if (dtype == DataType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16ToFloat(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = halfToFloat(s[i]);
  }
}

void fromFloat(void* dst, const float* src, DataType dtype, size_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DataType::kFloat32) {
    std::memcpy(dst, src, n * 4);
  } else if (dtype == DataType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) d[i] = floatToBf16(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = floatToHalf(src[i]);
  }
}

double sumSquares(const void* grad, DataType dtype, size_t n) {
  double total = 0.0;
  const int64_t blocks = static_cast<int64_t>((n + 65535) / 65536);
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t off = static_cast<size_t>(b) * 65536, len = std::min<size_t>(65536, n - off);
    float buf[1024];
    double acc = 0.0;
    for (size_t i = 0; i < len; i += 1024) {
      const size_t m = std::min<size_t>(1024, len - i);
      const void* src = static_cast<const char*>(grad) + (off + i) * dtypeSize(dtype);
      toFloat(buf, src, dtype, m);
      float part = 0.0f;
      for (size_t k = 0; k < m; ++k) part += buf[k] * buf[k];
      acc += part;
    }
    total += acc;
  }
  return total;
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

SgdCoefficients sgdCoefficients(const GroupHyper& h, float gradScale, int64_t step) {
  return {h.lr, h.momentum, h.dampening, h.weightDecay, gradScale, h.nesterov, step == 1};
}

void optimizerRun(OptimKind kind, const GroupHyper& h, const RunArgs& a, float* scratch, size_t scratchElems) {
  AdamHyper ah{h.lr, h.beta1, h.beta2, h.eps, h.weightDecay, kind == OptimKind::kAdamW, a.step, a.gradScale};
  const size_t es = dtypeSize(a.dtype);
  for (size_t off = 0; off < a.n; off += scratchElems) {
    const size_t m = std::min(scratchElems, a.n - off);
    const float* g;
    if (a.dtype == DataType::kFloat32) {
      g = static_cast<const float*>(a.grad) + off;
    } else {
      toFloat(scratch, static_cast<const char*>(a.grad) + off * es, a.dtype, m);
      g = scratch;
    }
    void* low = a.low && a.dtype != DataType::kFloat32 ? static_cast<char*>(a.low) + off * es : nullptr;
    if (kind == OptimKind::kSgd) {
      cpuSgdStep(sgdCoefficients(h, a.gradScale, a.step), a.master + off, g, a.state1 + off, m);
      if (low) fromFloat(low, a.master + off, a.dtype, m);
    } else {
      cpuAdamStep(ah, a.master + off, g, a.state1 + off, a.state2 + off, m, low, a.dtype);
    }
    if (a.low && a.dtype == DataType::kFloat32 && static_cast<float*>(a.low) + off != a.master + off)
      std::memcpy(static_cast<float*>(a.low) + off, a.master + off, m * 4);
  }
}

}  // namespace chorus::zero
