#pragma once
// The instruction set the CPU kernels run: the best this CPU supports, lowered
// by CHORUS_SIMD (for tests and benchmarks). Decided once per process, so that
// the reductions and the CPU Adam always agree.
namespace chorus {

enum class SimdLevel { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

SimdLevel cpuSimdLevel();
const char* simdLevelName(SimdLevel level);

}  // namespace chorus
