#include "zero/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "chorus/error.h"

namespace chorus::zero {

double scheduledLr(const DsConfig::Scheduler& s, int64_t it) {
  if (it < 0) return s.warmupMinLr;  // before the first scheduler step
  const int64_t warmSteps = std::max<int64_t>(s.warmupNumSteps, 2);
  const double warm = static_cast<double>(warmSteps);
  double gamma = 1.0;
  if (it < warmSteps) {
    if (s.warmupType == "log") gamma = std::log(static_cast<double>(it + 1)) / std::log(warm);
    else if (s.warmupType == "linear") gamma = static_cast<double>(it) / warm;
    else throw InvalidArgument("scheduler: warmup_type '" + s.warmupType + "' is not log or linear");
  } else if (s.type == "WarmupDecayLR") {
    gamma = std::max(0.0, static_cast<double>(s.totalNumSteps - it) /
                              std::max(1.0, static_cast<double>(s.totalNumSteps - warmSteps)));
  }
  return s.warmupMinLr + (s.warmupMaxLr - s.warmupMinLr) * gamma;
}

}  // namespace chorus::zero
