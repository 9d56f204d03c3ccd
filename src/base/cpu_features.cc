#include "base/cpu_features.h"

#include <string>

#include "chorus/error.h"
#include "chorus/settings.h"

namespace chorus {
namespace {

SimdLevel detect() {
  __builtin_cpu_init();
  // The kernels use FMA and F16C (half conversions) beside AVX2, BW beside AVX-512F.
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  const SimdLevel best = avx512 ? SimdLevel::kAvx512 : avx2 ? SimdLevel::kAvx2 : SimdLevel::kGeneric;
  std::string want = "auto";
  readSetting("CHORUS_SIMD", &want);
  SimdLevel cap;
  if (want == "auto" || want.empty() || want == "avx512") cap = SimdLevel::kAvx512;
  else if (want == "avx2") cap = SimdLevel::kAvx2;
  else if (want == "generic") cap = SimdLevel::kGeneric;
  else throw InvalidArgument("CHORUS_SIMD='" + want + "' is not one of auto, avx512, avx2, generic");
  return static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
}

}  // namespace

SimdLevel cpuSimdLevel() {
  static const SimdLevel level = detect();
  return level;
}

const char* simdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kGeneric: return "generic";
  }
  return "generic";
}

}  // namespace chorus
