#pragma once
// DeepSpeed's WarmupLR and WarmupDecayLR: the learning rate after `iteration`
// scheduler steps (iteration 0 is the first optimizer step).
#include <cstdint>

#include "zero/ds_config.h"

namespace chorus::zero {

double scheduledLr(const DsConfig::Scheduler& s, int64_t iteration);

}  // namespace chorus::zero
