#pragma once
// Element conversions between dtypes, and the sum of squares of a run of
// elements, on the CPU (the ZeRO engine's steps, the host stand-in, checks).
#include <cstddef>

#include "chorus/types.h"

namespace chorus {

// dst[i] = float(src[i]) and back; src/dst hold float32, float16 or bfloat16.
void toFloat(float* dst, const void* src, DataType dtype, size_t n);
void fromFloat(void* dst, const float* src, DataType dtype, size_t n);
// Any dtype to any other, element by element, through double.
void castElements(DataType to, void* dst, DataType from, const void* src, size_t n);
// Element i of data as a double, and back (to an integer: truncated toward zero;
// to bool: v != 0). The one per-element dtype switch; not for hot loops.
double elementToDouble(const void* data, DataType dtype, size_t i);
void elementFromDouble(void* data, DataType dtype, size_t i, double v);
// Sum of squares of n elements (float32, float16 or bfloat16; inf/nan propagate).
double sumSquares(const void* src, DataType dtype, size_t n);

}  // namespace chorus
