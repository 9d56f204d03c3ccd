#include "comm/shm/peer_path.h"

#include <algorithm>

#include "chorus/error.h"

namespace chorus {

namespace {
constexpr int kFirstTries = 2;  // samples of each path before comparing them
}  // namespace

double PeerPathChooser::Arm::median() const {
  const int n = std::min(samples, kKept);
  double v[kKept];
  // Insertion sort: five values (std::sort here trips GCC 12's -Warray-bounds).
  for (int i = 0; i < n; ++i) {
    int j = i;
    for (; j > 0 && v[j - 1] > secondsPerByte[i]; --j) v[j] = v[j - 1];
    v[j] = secondsPerByte[i];
  }
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

PeerPath parsePeerPath(const std::string& value) {
  if (value == "auto") return PeerPath::kAuto;
  if (value == "cache") return PeerPath::kCache;
  if (value == "memory") return PeerPath::kMemory;
  throw InvalidArgument("CHORUS_SHM_PEER_PATH='" + value + "' is not one of auto, cache, memory");
}

// Sizes within a factor of two share their statistics.
uint64_t PeerPathChooser::key(int op, size_t bytes) {
  return (static_cast<uint64_t>(op) << 8) | static_cast<uint64_t>(64 - __builtin_clzll(bytes | 1));
}

bool PeerPathChooser::viaMemory(int op, size_t bytes) {
  if (forced_ != PeerPath::kAuto) return forced_ == PeerPath::kMemory;
  Stats& s = stats_[key(op, bytes)];
  const uint64_t call = s.calls++;
  if (s.arms[0].samples < kFirstTries || s.arms[1].samples < kFirstTries) return call % 2 == 1;
  const double cache = s.arms[0].median(), memory = s.arms[1].median();
  const bool memoryFaster = memory < cache;
  const bool farApart = std::max(cache, memory) > kFarApart * std::min(cache, memory);
  return call % (farApart ? kExploreRarely : kExploreEvery) == 0 ? !memoryFaster : memoryFaster;
}

void PeerPathChooser::record(int op, size_t bytes, bool viaMemory, double seconds) {
  if (forced_ != PeerPath::kAuto || bytes == 0) return;
  Arm& a = stats_[key(op, bytes)].arms[viaMemory ? 1 : 0];
  a.secondsPerByte[a.samples++ % Arm::kKept] = seconds / static_cast<double>(bytes);
}

}  // namespace chorus
