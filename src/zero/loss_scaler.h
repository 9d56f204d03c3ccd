#pragma once
// Dynamic loss scaling with DeepSpeed's schedule: on overflow the step is
// skipped and, once `hysteresis` overflows have been absorbed, the scale is
// divided by the factor (never below the minimum; an overflow at the minimum
// is an error); after `window` clean steps since the last overflow it grows.
#include <cstdint>
#include <string>

namespace chorus::zero {

struct LossScalerConfig {
  bool dynamic = true;
  double staticScale = 1.0;          // when not dynamic
  int initialScalePower = 16;        // initial scale 2^power
  int64_t window = 1000;             // loss_scale_window
  int hysteresis = 2;                // overflows absorbed before the scale drops
  double minScale = 1.0;             // min_loss_scale
  double factor = 2.0;
  bool consecutiveHysteresis = false;  // refill hysteresis after every clean step
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);

  double scale() const { return scale_; }
  // Feeds one step's overflow flag (already agreed on by every rank). Returns
  // true when the step must be skipped. Throws chorus::Error on an overflow at
  // the minimum scale.
  bool update(bool overflow);

  // For checkpoints.
  std::string serialize() const;
  void deserialize(const std::string& s);

 private:
  LossScalerConfig cfg_;
  double scale_;
  int64_t iter_ = 0;
  int64_t lastOverflowIter_ = -1;
  int hysteresisLeft_;
};

}  // namespace chorus::zero
