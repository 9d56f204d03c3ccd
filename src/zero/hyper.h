#pragma once
// The optimizers chorus's ZeRO engine runs itself, and one parameter group's
// hyperparameters.
namespace chorus::zero {

enum class OptimKind { kAdam, kAdamW, kSgd, kLion, kAdagrad, kLamb };

// Optimizer state tensors per element beside the master weights.
inline int stateCount(OptimKind k) { return k == OptimKind::kAdam || k == OptimKind::kAdamW || k == OptimKind::kLamb ? 2 : 1; }

// One optimizer parameter group's hyperparameters, read from Python each step
// (so that schedulers and users that edit param_groups are obeyed).
struct GroupHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weightDecay = 0.0f;
  float momentum = 0.0f, dampening = 0.0f;
  bool nesterov = false;
  float lrDecay = 0.0f, initialAccumulator = 0.0f;  // Adagrad (torch's)
  float maxCoeff = 10.0f, minCoeff = 0.01f;         // LAMB's trust ratio bounds
  bool biasCorrection = true;  // Adam, LAMB
  bool epsInsideSqrt = false;  // LAMB
};

}  // namespace chorus::zero
