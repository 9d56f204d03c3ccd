#pragma once
// The optimizers chorus's ZeRO engine runs itself, and one parameter group's
// hyperparameters.
namespace chorus::zero {

enum class OptimKind { kAdam, kAdamW, kSgd };

// One optimizer parameter group's hyperparameters, read from Python each step
// (so that schedulers and users that edit param_groups are obeyed).
struct GroupHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weightDecay = 0.0f;
  float momentum = 0.0f, dampening = 0.0f;
  bool nesterov = false;
};

}  // namespace chorus::zero
