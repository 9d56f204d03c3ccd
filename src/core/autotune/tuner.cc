#include "core/autotune/tuner.h"

#include <algorithm>
#include <cmath>

#include "chorus/error.h"

namespace chorus::autotune {

namespace {
constexpr double kMinLogBytes = 16, kMaxLogBytes = 28;  // 64 KiB .. 256 MiB
const double kMinLogCycle = std::log10(0.1), kMaxLogCycle = std::log10(25.0);

constexpr int64_t kMinSlotBytes = 64 << 10;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double unit(double v, double lo, double hi) { return std::clamp((v - lo) / (hi - lo), 0.0, 1.0); }
// A category k of n <-> the middle of its nth of [0, 1].
double categoryPoint(int k, int n) { return (k + 0.5) / n; }
int categoryAt(double p, int n) { return std::clamp(static_cast<int>(p * n), 0, n - 1); }
}  // namespace


int Space::dims() const {
  return 2 + (responseCache ? 1 : 0) + (peerPath ? 1 : 0) + (maxSlotBytes > kMinSlotBytes ? 1 : 0) +
         (hierarchical ? 2 : 0);
}

Settings settingsAt(const Point& p, const Space& space) {
  Settings s;
  s.fusionThresholdBytes = static_cast<int64_t>(std::llround(std::exp2(kMinLogBytes + p[0] * (kMaxLogBytes - kMinLogBytes))));
  // Whole tenths of a millisecond: a setting the log shows as it is applied.
  s.cycleTimeMs = std::round(std::pow(10.0, kMinLogCycle + p[1] * (kMaxLogCycle - kMinLogCycle)) * 10) / 10;
  size_t i = 2;
  if (space.responseCache) s.responseCache = categoryAt(p[i++], 2);
  if (space.peerPath) s.peerPath = categoryAt(p[i++], 3);
  if (space.maxSlotBytes > kMinSlotBytes) {
    const double hi = std::log2(static_cast<double>(space.maxSlotBytes)), lo = std::log2(double(kMinSlotBytes));
    s.slotBytes = std::min<int64_t>(space.maxSlotBytes, int64_t{1} << static_cast<int>(std::lround(lo + p[i++] * (hi - lo))));
  }
  if (space.hierarchical) {
    s.hierarchicalAllreduce = categoryAt(p[i++], 2);
    s.hierarchicalAllgather = categoryAt(p[i++], 2);
  }
  return s;
}

Point pointOf(const Settings& s, const Space& space) {
  Point p{unit(std::log2(std::max<double>(s.fusionThresholdBytes, 1)), kMinLogBytes, kMaxLogBytes),
          unit(std::log10(std::max(s.cycleTimeMs, 1e-3)), kMinLogCycle, kMaxLogCycle)};
  if (space.responseCache) p.push_back(categoryPoint(std::max(s.responseCache, 0), 2));
  if (space.peerPath) p.push_back(categoryPoint(std::max(s.peerPath, 0), 3));
  if (space.maxSlotBytes > kMinSlotBytes) {
    const double hi = std::log2(static_cast<double>(space.maxSlotBytes)), lo = std::log2(double(kMinSlotBytes));
    p.push_back(unit(std::log2(static_cast<double>(std::max<int64_t>(s.slotBytes, kMinSlotBytes))), lo, hi));
  }
  if (space.hierarchical) {
    p.push_back(categoryPoint(std::max(s.hierarchicalAllreduce, 0), 2));
    p.push_back(categoryPoint(std::max(s.hierarchicalAllgather, 0), 2));
  }
  return p;
}

Tuner::Tuner(TunerOptions options, Settings start, Space space)
    // The starting settings are the first point scored, two random ones follow.
    : options_(std::move(options)),
      space_(space),
      current_(start),
      start_(start),
      opt_(space.dims(), options_.seed, 3, options_.noise),
      warmupLeft_(options_.warmupSamples) {
  if (options_.stepsPerSample < 1 || options_.maxSamples < 1) {
    throw InvalidArgument("autotune: steps per sample and samples must be at least 1");
  }
  if (!options_.logPath.empty()) {
    log_.open(options_.logPath, std::ios::trunc);
    if (!log_) throw InvalidArgument("autotune: cannot write the log file '" + options_.logPath + "'");
    log_ << "sample,fusion_threshold_bytes,cycle_time_ms,response_cache,shm_peer_path,shm_slot_bytes,"
            "hierarchical_allreduce,hierarchical_allgather,bytes_per_second\n"
         << std::flush;
  }
}

void Tuner::log(const std::string& what, const Settings& s, double score) {
  if (!log_) return;
  // (-1, and a slot of 0: not tuned in this process set)
  log_ << what << ',' << s.fusionThresholdBytes << ',' << s.cycleTimeMs << ',' << s.responseCache << ','
       << s.peerPath << ',' << s.slotBytes << ',' << s.hierarchicalAllreduce << ',' << s.hierarchicalAllgather << ','
       << score << '\n'
       << std::flush;
}

std::optional<Settings> Tuner::record(int64_t bytes, double seconds) {
  if (done_) return std::nullopt;
  double score = 0;
  if (options_.minSampleSeconds > 0) {
    // Timed samples end where traffic starts after a quiet spell (a training
    // step's first gradients), so that each holds whole steps: ended anywhere, a
    // sample's bytes per second depended on how much of a burst it caught. This
    // cycle then opens the next sample. (Traffic with no quiet spell: at 4x the time.)
    const bool burst = bytes > 0 && quietBefore_;
    quietBefore_ = bytes <= 0;
    const bool full = steps_ >= options_.stepsPerSample && seconds_ >= options_.minSampleSeconds;
    const bool close = full && (burst || seconds_ >= 4 * options_.minSampleSeconds);
    if (close) score = seconds_ > 0 ? static_cast<double>(bytes_) / seconds_ : 0.0;
    if (close) steps_ = 0, bytes_ = 0, seconds_ = 0;
    seconds_ += seconds;
    if (bytes > 0) bytes_ += bytes, ++steps_;
    if (!close) return std::nullopt;
  } else {
    seconds_ += seconds;  // idle time counts: a long cycle time shows as waiting
    if (bytes <= 0) return std::nullopt;
    bytes_ += bytes;
    if (++steps_ < options_.stepsPerSample) return std::nullopt;
    score = seconds_ > 0 ? static_cast<double>(bytes_) / seconds_ : 0.0;
    steps_ = 0;
    bytes_ = 0;
    seconds_ = 0;
  }
  if (warmupLeft_ > 0) {
    --warmupLeft_;
    log("warmup", current_, score);
    return std::nullopt;
  }
  Settings next;
  if (confirming_) {
    // The optimiser's pick against the starting settings, alternately: the pick
    // stays only if its median is not below theirs (never end slower than the start).
    (current_ == start_ ? startScores_ : pickScores_).push_back(score);
    log(current_ == start_ ? "confirm-start" : "confirm-pick", current_, score);
    const size_t want = static_cast<size_t>(options_.confirmSamples);
    if (pickScores_.size() >= want && startScores_.size() >= want) {
      const double pick = median(pickScores_), start = median(startScores_);
      next = pick >= start ? pick_ : start_;
      done_ = true;
      log("best", next, next == pick_ ? pick : start);
    } else {
      next = current_ == start_ ? pick_ : start_;
    }
  } else {
    opt_.addSample(pointOf(current_, space_), score);
    log(std::to_string(opt_.samples()), current_, score);
    if (opt_.samples() >= options_.maxSamples) {
      double best = 0;
      next = settingsAt(opt_.best(&best), space_);
      if (options_.confirmSamples > 0 && !(next == start_)) {
        confirming_ = true;
        pick_ = next;
      } else {
        done_ = true;
        log("best", next, best);
      }
    } else {
      next = settingsAt(opt_.next(), space_);
    }
  }
  if (next == current_) return std::nullopt;
  current_ = next;
  return next;
}

}  // namespace chorus::autotune
