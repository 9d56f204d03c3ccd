#pragma once
// Element conversions between the floating dtypes, and the sum of squares of a
// run of elements, on the CPU (the ZeRO engine's steps, the host stand-in).
#include <cstddef>

#include "chorus/types.h"

namespace chorus {

// dst[i] = float(src[i]) and back; src/dst hold float32, float16 or bfloat16.
void toFloat(float* dst, const void* src, DataType dtype, size_t n);
void fromFloat(void* dst, const float* src, DataType dtype, size_t n);
// Any floating dtype to any other, element by element.
void castElements(DataType to, void* dst, DataType from, const void* src, size_t n);
// Sum of squares of n elements (float32, float16 or bfloat16; inf/nan propagate).
double sumSquares(const void* src, DataType dtype, size_t n);

}  // namespace chorus
