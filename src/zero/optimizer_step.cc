#include "zero/optimizer_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "chorus/error.h"
#include "reduce/cast.h"
#include "reduce/cpu_optimizer.h"

namespace chorus::zero {

SgdCoefficients sgdCoefficients(const GroupHyper& h, float gradScale, int64_t step) {
  return {h.lr, h.momentum, h.dampening, h.weightDecay, gradScale, h.nesterov, step == 1};
}

namespace {

// f(offset, count, fp32 gradients, model-dtype output or null) over the run in
// scratch-sized chunks; an fp32 output apart from the master is copied after.
template <typename F>
void chunks(const RunArgs& a, float* scratch, size_t scratchElems, bool writes, F f) {
  const size_t es = dtypeSize(a.dtype);
  for (size_t off = 0; off < a.n; off += scratchElems) {
    const size_t m = std::min(scratchElems, a.n - off);
    const float* g = nullptr;
    if (a.grad && a.dtype == DataType::kFloat32) {
      g = static_cast<const float*>(a.grad) + off;
    } else if (a.grad) {
      toFloat(scratch, static_cast<const char*>(a.grad) + off * es, a.dtype, m);
      g = scratch;
    }
    void* low = writes && a.low && a.dtype != DataType::kFloat32 ? static_cast<char*>(a.low) + off * es : nullptr;
    f(off, m, g, low);
    if (writes && a.low && a.dtype == DataType::kFloat32 && static_cast<float*>(a.low) + off != a.master + off)
      std::memcpy(static_cast<float*>(a.low) + off, a.master + off, m * 4);
  }
}

}  // namespace

void optimizerRun(OptimKind kind, const GroupHyper& h, const RunArgs& a, float* scratch, size_t scratchElems) {
  AdamHyper ah{h.lr, h.beta1, h.beta2, h.eps, h.weightDecay, kind == OptimKind::kAdamW, a.step, a.gradScale,
               h.biasCorrection};
  // torch's Adagrad starts its sums at initial_accumulator_value; its lr decays with the steps.
  if (kind == OptimKind::kAdagrad && a.step == 1 && h.initialAccumulator != 0.0f)
    std::fill(a.state1, a.state1 + a.n, h.initialAccumulator);
  const LionCoefficients lion{h.lr, h.beta1, h.beta2, 1.0f - h.lr * h.weightDecay, a.gradScale};
  const AdagradCoefficients adagrad{h.lr / (1.0f + static_cast<float>(a.step - 1) * h.lrDecay), h.eps, h.weightDecay,
                                    a.gradScale};
  chunks(a, scratch, scratchElems, true, [&](size_t off, size_t m, const float* g, void* low) {
    switch (kind) {
      case OptimKind::kSgd:
        cpuSgdStep(sgdCoefficients(h, a.gradScale, a.step), a.master + off, g, a.state1 + off, m);
        if (low) fromFloat(low, a.master + off, a.dtype, m);
        break;
      case OptimKind::kLion:
        cpuLionStep(lion, a.master + off, g, a.state1 + off, m, low, a.dtype);
        break;
      case OptimKind::kAdagrad:
        cpuAdagradStep(adagrad, a.master + off, g, a.state1 + off, m, low, a.dtype);
        break;
      case OptimKind::kLamb:
        throw InvalidArgument("ZeRO engine: LAMB steps per parameter (lambMomentsRun, lambApplyRun)");
      case OptimKind::kAdam:
      case OptimKind::kAdamW:
        cpuAdamStep(ah, a.master + off, g, a.state1 + off, a.state2 + off, m, low, a.dtype);
        break;
    }
  });
}

LambCoefficients lambCoefficients(const GroupHyper& h, float gradScale, int64_t step) {
  LambHyper l;
  l.lr = h.lr;
  l.beta1 = h.beta1;
  l.beta2 = h.beta2;
  l.eps = h.eps;
  l.weightDecay = h.weightDecay;
  l.maxCoeff = h.maxCoeff;
  l.minCoeff = h.minCoeff;
  l.biasCorrection = h.biasCorrection;
  l.epsInsideSqrt = h.epsInsideSqrt;
  l.step = step;
  l.gradScale = gradScale;
  return lambCoefficients(l);
}

void lambMomentsRun(const GroupHyper& h, const RunArgs& a, float* scratch, size_t scratchElems, double* wsq,
                    double* usq) {
  const LambCoefficients c = lambCoefficients(h, a.gradScale, a.step);
  chunks(a, scratch, scratchElems, false, [&](size_t off, size_t m, const float* g, void*) {
    cpuLambMoments(c, a.master + off, g, a.state1 + off, a.state2 + off, m, wsq, usq);
  });
}

void lambApplyRun(const GroupHyper& h, const RunArgs& a, float trust) {
  const LambCoefficients c = lambCoefficients(h, a.gradScale, a.step);
  RunArgs noGrad = a;
  noGrad.grad = nullptr;
  chunks(noGrad, nullptr, a.n ? a.n : 1, true, [&](size_t off, size_t m, const float*, void* low) {
    cpuLambApply(c, trust, a.master + off, a.state1 + off, a.state2 + off, m, low, a.dtype);
  });
}

}  // namespace chorus::zero
