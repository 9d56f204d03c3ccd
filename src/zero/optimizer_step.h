#pragma once
// One optimizer update over a run of the fp32 partition, with gradients in the
// model dtype (converted in cache-sized chunks) and the updated parameters also
// written in the model dtype when it is not float32.
#include <cstddef>
#include <cstdint>

#include "chorus/types.h"
#include "device/device_backend.h"
#include "reduce/cpu_optimizer.h"
#include "zero/hyper.h"

namespace chorus::zero {

struct RunArgs {
  float* master;
  float* state1;  // Adam, LAMB, Lion: exp_avg; SGD: momentum buffer; Adagrad: the sum of squares
  float* state2;  // Adam, LAMB: exp_avg_sq
  const void* grad;
  void* low;      // updated parameters in the model dtype, or null
  DataType dtype; // of grad and low
  size_t n;
  float gradScale;
  int64_t step;   // 1 for the first update
};

SgdCoefficients sgdCoefficients(const GroupHyper& h, float gradScale, int64_t step);

void optimizerRun(OptimKind kind, const GroupHyper& h, const RunArgs& a, float* scratch, size_t scratchElems);

// LAMB over one piece of a parameter: the moments, adding its squared norms to
// *wsq and *usq; then, with the whole parameter's trust ratio, the update.
LambCoefficients lambCoefficients(const GroupHyper& h, float gradScale, int64_t step);
void lambMomentsRun(const GroupHyper& h, const RunArgs& a, float* scratch, size_t scratchElems, double* wsq,
                    double* usq);
void lambApplyRun(const GroupHyper& h, const RunArgs& a, float trust);


}  // namespace chorus::zero
