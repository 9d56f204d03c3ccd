#pragma once
// The CPU Adam/AdamW step of the ZeRO engine: fp32 master weights and state,
// SIMD (AVX-512/AVX2 chosen at run time) across OpenMP threads. Matches
// torch.optim.Adam / AdamW's update to float32 rounding.
#include <cstddef>
#include <cstdint>

#include "chorus/types.h"
#include "device/device_backend.h"

namespace chorus::zero {

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weightDecay = 0.0f;
  bool adamw = false;  // decoupled weight decay (AdamW) instead of L2 (Adam)
  int64_t step = 1;    // 1 for the first update (bias correction)
  float gradScale = 1.0f;  // gradients are multiplied by it first (loss-scale and clipping)
};

// The step's coefficients (the device kernels apply the same ones).
AdamCoefficients adamCoefficients(const AdamHyper& h);

// Updates n parameters in place. When lowPrecision is given, also writes the
// updated parameters there as `lowDtype` (float16 or bfloat16), in the same pass.
void cpuAdamStep(const AdamHyper& h, float* params, const float* grads, float* expAvg, float* expAvgSq, size_t n,
                 void* lowPrecision = nullptr, DataType lowDtype = DataType::kBFloat16);
void cpuAdamStep(const AdamCoefficients& c, float* params, const float* grads, float* expAvg, float* expAvgSq,
                 size_t n, void* lowPrecision = nullptr, DataType lowDtype = DataType::kBFloat16);

// The instruction set the Adam kernel runs with.
const char* adamSimdLevel();

}  // namespace chorus::zero
