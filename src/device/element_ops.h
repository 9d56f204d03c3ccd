#pragma once
// Element-wise reduction of integers, for the CUDA kernels and the CPU alike:
// in the integer type itself, wrapping as the CPU kernels and torch do (a trip
// through double loses int64 values above 2^53; a float-to-uint8 cast saturates).
#include <cstdint>
#include <type_traits>

#ifdef __CUDACC__
#define CHORUS_HOST_DEVICE __host__ __device__
#else
#define CHORUS_HOST_DEVICE
#endif

namespace chorus {

// op: ReduceOp's values (2 Min, 3 Max, 4 Product; anything else Sum). Sum and
// Product wrap modulo 2^bits (in 64-bit unsigned arithmetic: no overflow, no
// promotion to int); bool is logical (or, and).
template <typename T>
CHORUS_HOST_DEVICE inline T reduceInteger(T a, T b, int op) {
  static_assert(std::is_integral<T>::value, "reduceInteger is for integer types");
  if (std::is_same<T, bool>::value) {
    switch (op) {
      case 2:
      case 4: return a && b;
      default: return a || b;
    }
  }
  switch (op) {
    case 2: return a < b ? a : b;
    case 3: return a > b ? a : b;
    case 4: return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    default: return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
}

}  // namespace chorus
