#include "core/autotune/tuner.h"

#include <algorithm>
#include <cmath>

#include "chorus/error.h"

namespace chorus::autotune {

namespace {
constexpr double kMinLogBytes = 16, kMaxLogBytes = 28;  // 64 KiB .. 256 MiB
const double kMinLogCycle = std::log10(0.1), kMaxLogCycle = std::log10(25.0);

double unit(double v, double lo, double hi) { return std::clamp((v - lo) / (hi - lo), 0.0, 1.0); }
}  // namespace

Settings settingsAt(const Point& p) {
  Settings s;
  s.fusionThresholdBytes = static_cast<int64_t>(std::llround(std::exp2(kMinLogBytes + p[0] * (kMaxLogBytes - kMinLogBytes))));
  // Whole tenths of a millisecond: a setting the log shows as it is applied.
  s.cycleTimeMs = std::round(std::pow(10.0, kMinLogCycle + p[1] * (kMaxLogCycle - kMinLogCycle)) * 10) / 10;
  return s;
}

Point pointOf(const Settings& s) {
  return {unit(std::log2(std::max<double>(s.fusionThresholdBytes, 1)), kMinLogBytes, kMaxLogBytes),
          unit(std::log10(std::max(s.cycleTimeMs, 1e-3)), kMinLogCycle, kMaxLogCycle)};
}

Tuner::Tuner(TunerOptions options, Settings start)
    // The starting settings are the first point scored, two random ones follow.
    : options_(std::move(options)), current_(start), opt_(2, options_.seed, 3, options_.noise), warmupLeft_(options_.warmupSamples) {
  if (options_.stepsPerSample < 1 || options_.maxSamples < 1) {
    throw InvalidArgument("autotune: steps per sample and samples must be at least 1");
  }
  if (!options_.logPath.empty()) {
    log_.open(options_.logPath, std::ios::trunc);
    if (!log_) throw InvalidArgument("autotune: cannot write the log file '" + options_.logPath + "'");
    log_ << "sample,fusion_threshold_bytes,cycle_time_ms,bytes_per_second\n" << std::flush;
  }
}

void Tuner::log(const std::string& what, const Settings& s, double score) {
  if (!log_) return;
  log_ << what << ',' << s.fusionThresholdBytes << ',' << s.cycleTimeMs << ',' << score << '\n' << std::flush;
}

std::optional<Settings> Tuner::record(int64_t bytes, double seconds) {
  if (done_) return std::nullopt;
  seconds_ += seconds;  // idle time counts: a long cycle time shows as waiting
  if (bytes <= 0) return std::nullopt;
  bytes_ += bytes;
  if (++steps_ < options_.stepsPerSample) return std::nullopt;
  const double score = seconds_ > 0 ? static_cast<double>(bytes_) / seconds_ : 0.0;
  steps_ = 0;
  bytes_ = 0;
  seconds_ = 0;
  if (warmupLeft_ > 0) {
    --warmupLeft_;
    log("warmup", current_, score);
    return std::nullopt;
  }
  opt_.addSample(pointOf(current_), score);
  log(std::to_string(opt_.samples()), current_, score);
  Settings next;
  if (opt_.samples() >= options_.maxSamples) {
    double best = 0;
    next = settingsAt(opt_.best(&best));
    done_ = true;
    log("best", next, best);
  } else {
    next = settingsAt(opt_.next());
  }
  if (next == current_) return std::nullopt;
  current_ = next;
  return next;
}

}  // namespace chorus::autotune
