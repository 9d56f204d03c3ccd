#pragma once
// One optimizer update over a run of the fp32 partition, with gradients in the
// model dtype (converted in cache-sized chunks) and the updated parameters also
// written in the model dtype when it is not float32.
#include <cstddef>
#include <cstdint>

#include "chorus/types.h"
#include "device/device_backend.h"
#include "zero/hyper.h"

namespace chorus::zero {

struct RunArgs {
  float* master;
  float* state1;  // Adam: exp_avg; SGD: momentum buffer
  float* state2;  // Adam: exp_avg_sq
  const void* grad;
  void* low;      // updated parameters in the model dtype, or null
  DataType dtype; // of grad and low
  size_t n;
  float gradScale;
  int64_t step;   // 1 for the first update
};

SgdCoefficients sgdCoefficients(const GroupHyper& h, float gradScale, int64_t step);
// torch.optim.SGD's update of n parameters (device_backend.h's SgdCoefficients).
void cpuSgdStep(const SgdCoefficients& c, float* p, const float* g, float* buf, size_t n);

void optimizerRun(OptimKind kind, const GroupHyper& h, const RunArgs& a, float* scratch, size_t scratchElems);

// Sum of squares of n gradient elements in the model dtype (inf/nan propagate).
double sumSquares(const void* grad, DataType dtype, size_t n);
// dst[i] = float(src[i]) and back.
void toFloat(float* dst, const void* src, DataType dtype, size_t n);
void fromFloat(void* dst, const float* src, DataType dtype, size_t n);

}  // namespace chorus::zero
