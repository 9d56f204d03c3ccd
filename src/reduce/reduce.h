#pragma once
// Element-wise reduction and scaling kernels for every dtype. float16 and
// bfloat16 are computed in float32 and rounded once per call.
#include <cstddef>

#include "chorus/types.h"

namespace chorus {

// out[i] = a[i] op b[i]; out may alias a or b. Average reduces as Sum (scaled later).
void reduceBuffers(DataType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n);

// out[i] = inputs[0][i] op inputs[1][i] op ... (in that order, so that every rank
// computing the same element gets the same bits), times scale (floating dtypes
// only: Average's division folded into the reduction). out may alias an input.
// float16/bfloat16 accumulate and scale in float32 and round once.
void reduceMany(DataType dtype, ReduceOp op, void* out, const void* const* inputs, int n, size_t count,
                double scale = 1.0);

// reduceMany whose results go to every outs[k] (nOuts of them) with
// non-temporal stores, line by line as the inputs are read, and to cached (when
// not null) with ordinary stores; the same bits as reduceMany. Outputs that do
// not share their position within a 64-byte line take ordinary stores. The
// caller fences (_mm_sfence) before others read the streamed results.
void reduceManyStreamed(DataType dtype, ReduceOp op, void* cached, void* const* outs, int nOuts,
                        const void* const* inputs, int n, size_t count, double scale = 1.0);

inline bool isFloating(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 || dtype == DataType::kFloat16 ||
         dtype == DataType::kBFloat16;
}

// The instruction set the kernels run with: "avx512", "avx2" or "generic".
const char* simdLevel();

// buf[i] *= factor. Integers are scaled in double and truncated toward zero.
void scaleBuffer(DataType dtype, void* buf, size_t n, double factor);

// Integer dtypes: buf[i] /= divisor, truncating. Other dtypes: multiply by 1/divisor.
void divideBuffer(DataType dtype, void* buf, size_t n, int64_t divisor);

// dst[i] = src[i] * factor (copy with scaling; factor 1 is a plain copy).
void scaleCopy(DataType dtype, void* dst, const void* src, size_t n, double factor);

}  // namespace chorus
