#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "chorus/error.h"

namespace chorus::zero {

LossScaler::LossScaler(const LossScalerConfig& cfg)
    : cfg_(cfg),
      scale_(cfg.dynamic ? std::ldexp(1.0, cfg.initialScalePower) : cfg.staticScale),
      hysteresisLeft_(cfg.hysteresis) {
  if (cfg.dynamic && (cfg.window <= 0 || cfg.hysteresis <= 0 || cfg.factor <= 1.0 || cfg.minScale <= 0)) {
    throw InvalidArgument("loss scaler: loss_scale_window and hysteresis must be > 0, min_loss_scale > 0");
  }
}

bool LossScaler::update(bool overflow) {
  if (!cfg_.dynamic) {
    ++iter_;
    return overflow;
  }
  if (overflow) {
    if (hysteresisLeft_ <= 1) {
      if (scale_ <= cfg_.minScale) {
        throw Error("loss scale is already at min_loss_scale (" + std::to_string(cfg_.minScale) +
                    ") and the gradients still overflow; lower the learning rate or min_loss_scale");
      }
      scale_ = std::max(scale_ / cfg_.factor, cfg_.minScale);
    } else {
      --hysteresisLeft_;
    }
    lastOverflowIter_ = iter_;
  } else {
    if (cfg_.consecutiveHysteresis) hysteresisLeft_ = cfg_.hysteresis;
    if ((iter_ - lastOverflowIter_) % cfg_.window == 0) {
      if (!cfg_.consecutiveHysteresis) hysteresisLeft_ = cfg_.hysteresis;
      scale_ *= cfg_.factor;
    }
  }
  ++iter_;
  return overflow;
}

std::string LossScaler::serialize() const {
  std::ostringstream os;
  os.precision(17);
  os << scale_ << " " << iter_ << " " << lastOverflowIter_ << " " << hysteresisLeft_;
  return os.str();
}

void LossScaler::deserialize(const std::string& s) {
  std::istringstream in(s);
  if (!(in >> scale_ >> iter_ >> lastOverflowIter_ >> hysteresisLeft_)) {
    throw InvalidArgument("loss scaler state '" + s + "' is malformed");
  }
}

}  // namespace chorus::zero
