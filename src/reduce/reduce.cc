#include "reduce/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/cpu_features.h"
#include "chorus/error.h"

namespace chorus {

// One table of kernels per instruction set, each compiled with its own flags.
#define CHORUS_DECLARE_KERNELS(ns)                                                                      \
  namespace ns {                                                                                        \
  void reduceMany(DataType, ReduceOp, void*, const void* const*, int, size_t, double);                  \
  void reduceBuffers(DataType, ReduceOp, void*, const void*, const void*, size_t);                      \
  void scaleCopy(DataType, void*, const void*, size_t, double);                                         \
  void reduceManyStreamed(DataType, ReduceOp, void*, void* const*, int, const void* const*, int, size_t, size_t,  \
                          double);                                                                      \
  }
CHORUS_DECLARE_KERNELS(kernels_generic)
CHORUS_DECLARE_KERNELS(kernels_avx2)
CHORUS_DECLARE_KERNELS(kernels_avx512)

namespace {
struct Kernels {
  const char* name;
  void (*reduceMany)(DataType, ReduceOp, void*, const void* const*, int, size_t, double);
  void (*reduceBuffers)(DataType, ReduceOp, void*, const void*, const void*, size_t);
  void (*scaleCopy)(DataType, void*, const void*, size_t, double);
  void (*reduceManyStreamed)(DataType, ReduceOp, void*, void* const*, int, const void* const*, int, size_t, size_t,
                             double);
};

const Kernels kGeneric{"generic", kernels_generic::reduceMany, kernels_generic::reduceBuffers,
                       kernels_generic::scaleCopy, kernels_generic::reduceManyStreamed};
const Kernels kAvx2{"avx2", kernels_avx2::reduceMany, kernels_avx2::reduceBuffers, kernels_avx2::scaleCopy,
                    kernels_avx2::reduceManyStreamed};
const Kernels kAvx512{"avx512", kernels_avx512::reduceMany, kernels_avx512::reduceBuffers,
                      kernels_avx512::scaleCopy, kernels_avx512::reduceManyStreamed};

const Kernels& pick() {
  switch (cpuSimdLevel()) {
    case SimdLevel::kAvx512: return kAvx512;
    case SimdLevel::kAvx2: return kAvx2;
    case SimdLevel::kGeneric: break;
  }
  return kGeneric;
}

const Kernels& kernels() {
  static const Kernels& k = pick();
  return k;
}
}  // namespace

const char* simdLevel() { return kernels().name; }

namespace {
// Adasum is not element-wise: the executor combines it (reduce/adasum.h).
void checkElementwise(ReduceOp op) {
  if (op == ReduceOp::kAdasum) throw Error("internal error: Adasum reached an element-wise reduction");
}

void checkScale(DataType dtype, double scale) {
  if (scale != 1.0 && !isFloating(dtype))
    throw Error(std::string("internal error: a scaled reduction of ") + dtypeName(dtype));
}
}  // namespace

void reduceMany(DataType dtype, ReduceOp op, void* out, const void* const* inputs, int n, size_t count, double scale) {
  checkElementwise(op);
  checkScale(dtype, scale);
  kernels().reduceMany(dtype, op, out, inputs, n, count, scale);
}
void reduceBuffers(DataType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  checkElementwise(op);
  kernels().reduceBuffers(dtype, op, out, a, b, n);
}
void scaleCopy(DataType dtype, void* dst, const void* src, size_t n, double factor) {
  kernels().scaleCopy(dtype, dst, src, n, factor);
}

void reduceManyStreamed(DataType dtype, ReduceOp op, void* cached, void* const* outs, int nOuts,
                        const void* const* inputs, int n, size_t count, double scale) {
  checkElementwise(op);
  checkScale(dtype, scale);
  const size_t es = dtypeSize(dtype);
  const uintptr_t at = nOuts ? reinterpret_cast<uintptr_t>(outs[0]) % 64 : 0;
  bool lined = at % es == 0;
  for (int k = 1; k < nOuts; ++k) lined = lined && reinterpret_cast<uintptr_t>(outs[k]) % 64 == at;
  if (!lined) {  // outputs that sit differently within a line: ordinary stores
    void* first = nOuts ? outs[0] : cached;
    if (!first) return;
    reduceMany(dtype, op, first, inputs, n, count, scale);
    for (int k = 1; k < nOuts; ++k) std::memcpy(outs[k], first, count * es);
    if (cached && cached != first) std::memcpy(cached, first, count * es);
    return;
  }
  const size_t head = std::min(count, (64 - at) % 64 / es);
  kernels().reduceManyStreamed(dtype, op, cached, outs, nOuts, inputs, n, head, count, scale);
}

// An integer average rounds down (floor), as torch's floor_divide and Horovod's.
inline int64_t floorDiv(int64_t a, int64_t d) {
  const int64_t q = a / d;
  return (a % d != 0 && ((a < 0) != (d < 0))) ? q - 1 : q;
}

template <typename T>
void divideTyped(T* buf, size_t n, int64_t d) {
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(floorDiv(static_cast<int64_t>(buf[i]), d));
}

void divideBuffer(DataType dtype, void* buf, size_t n, int64_t divisor) {
  switch (dtype) {
    case DataType::kUInt8: return divideTyped(static_cast<uint8_t*>(buf), n, divisor);
    case DataType::kInt8: return divideTyped(static_cast<int8_t*>(buf), n, divisor);
    case DataType::kInt16: return divideTyped(static_cast<int16_t*>(buf), n, divisor);
    case DataType::kUInt16: return divideTyped(static_cast<uint16_t*>(buf), n, divisor);
    case DataType::kInt32: return divideTyped(static_cast<int32_t*>(buf), n, divisor);
    case DataType::kInt64: return divideTyped(static_cast<int64_t*>(buf), n, divisor);
    default: return scaleBuffer(dtype, buf, n, 1.0 / static_cast<double>(divisor));
  }
}

void scaleBuffer(DataType dtype, void* buf, size_t n, double factor) {
  scaleCopy(dtype, buf, buf, n, factor);
}

}  // namespace chorus
