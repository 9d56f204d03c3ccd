#include "zero/optimizer_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "reduce/cast.h"
#include "reduce/cpu_optimizer.h"

namespace chorus::zero {

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
