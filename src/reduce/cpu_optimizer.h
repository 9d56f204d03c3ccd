#pragma once
// The CPU optimizer steps (the ZeRO engine's, the host stand-in's): Adam/AdamW
// with fp32 master weights and state, SIMD (AVX-512/AVX2 chosen at run time)
// across OpenMP threads, and SGD. They match torch.optim's updates to float32
// rounding; the device kernels apply the same coefficients.
#include <cstddef>
#include <cstdint>

#include "chorus/types.h"

namespace chorus {

// Adam/AdamW's per-step numbers, worked out once on the host
// (adamCoefficients) so that the device and the CPU apply the same ones:
// grad' = grad * gradScale + l2 * p; m = beta1 m + (1 - beta1) grad';
// v = beta2 v + (1 - beta2) grad'^2; p = p * decay - stepSize * m / (sqrt(v) * invBias2Sqrt + eps).
struct AdamCoefficients {
  float beta1, beta2, eps, stepSize, invBias2Sqrt, decay, l2, gradScale;
};

// torch.optim.SGD's update: d = grad * gradScale + weightDecay * p; with
// momentum, buf = first ? d : momentum * buf + (1 - dampening) * d and d = buf
// (nesterov: d + momentum * buf); p -= lr * d.
struct SgdCoefficients {
  float lr, momentum, dampening, weightDecay, gradScale;
  bool nesterov, first;
};


struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weightDecay = 0.0f;
  bool adamw = false;  // decoupled weight decay (AdamW) instead of L2 (Adam)
  int64_t step = 1;    // 1 for the first update (bias correction)
  float gradScale = 1.0f;  // gradients are multiplied by it first (loss-scale and clipping)
  bool biasCorrection = true;  // false: DeepSpeed's Adam with bias_correction off (raw moments)
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

// torch.optim.SGD's update of n parameters.
void cpuSgdStep(const SgdCoefficients& c, float* p, const float* g, float* buf, size_t n);

// Lion (DeepSpeed's CPU Lion): g' = g * gradScale; p = p * decay - lr * sign(beta1 m + (1 - beta1) g');
// m = beta2 m + (1 - beta2) g'. decay = 1 - lr * weight_decay.
struct LionCoefficients {
  float lr, beta1, beta2, decay, gradScale;
};
void cpuLionStep(const LionCoefficients& c, float* p, const float* g, float* expAvg, size_t n,
                 void* lowPrecision = nullptr, DataType lowDtype = DataType::kBFloat16);

// Adagrad (torch.optim.Adagrad, DeepSpeed's CPU Adagrad): g' = g * gradScale + weightDecay * p;
// sum += g'^2; p -= lr * g' / (sqrt(sum) + eps). lr is the step's (torch's lr_decay applied).
struct AdagradCoefficients {
  float lr, eps, weightDecay, gradScale;
};
void cpuAdagradStep(const AdagradCoefficients& c, float* p, const float* g, float* sum, size_t n,
                    void* lowPrecision = nullptr, DataType lowDtype = DataType::kBFloat16);

// LAMB (DeepSpeed's FusedLamb), per tensor in two passes: the moments and the
// squared norms of the weights and of the update u = m / (sqrt(v) + eps) + decay * p,
// then p -= stepSize * trust * u with trust = lambTrust(the norms over the whole tensor).
struct LambCoefficients {
  float beta1, beta2, eps, decay, stepSize, gradScale, maxCoeff, minCoeff;
  bool epsInsideSqrt;
};
struct LambHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weightDecay = 0.0f;
  float maxCoeff = 10.0f, minCoeff = 0.01f;
  bool biasCorrection = true, epsInsideSqrt = false;
  int64_t step = 1;
  float gradScale = 1.0f;
};
LambCoefficients lambCoefficients(const LambHyper& h);
// Adds this run's squared norms to *wsq and *usq.
void cpuLambMoments(const LambCoefficients& c, const float* p, const float* g, float* expAvg, float* expAvgSq,
                    size_t n, double* wsq, double* usq);
float lambTrust(const LambCoefficients& c, double wsq, double usq);
void cpuLambApply(const LambCoefficients& c, float trust, float* p, const float* expAvg, const float* expAvgSq,
                  size_t n, void* lowPrecision = nullptr, DataType lowDtype = DataType::kBFloat16);

}  // namespace chorus
