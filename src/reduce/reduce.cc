#include "reduce/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "chorus/error.h"
#include "reduce/half.h"

namespace chorus {

namespace {

template <typename T>
void reduceTyped(ReduceOp op, T* out, const T* a, const T* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] + b[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::kProduct:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] * b[i]);
      return;
  }
}

// bool: sum/max are logical or, min/product logical and.
void reduceBool(ReduceOp op, uint8_t* out, const uint8_t* a, const uint8_t* b, size_t n) {
  const bool isOr = op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kMax;
  if (isOr) {
    for (size_t i = 0; i < n; ++i) out[i] = (a[i] | b[i]) ? 1 : 0;
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = (a[i] && b[i]) ? 1 : 0;
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void reduceHalf(ReduceOp op, uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n) {
  constexpr size_t kBlock = 256;
  float fa[kBlock], fb[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) {
      fa[i] = ToF(a[base + i]);
      fb[i] = ToF(b[base + i]);
    }
    reduceTyped<float>(op, fa, fa, fb, m);
    for (size_t i = 0; i < m; ++i) out[base + i] = FromF(fa[i]);
  }
}

template <typename T>
void scaleTyped(T* dst, const T* src, size_t n, double factor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T f = static_cast<T>(factor);
    for (size_t i = 0; i < n; ++i) dst[i] = src[i] * f;
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(std::trunc(static_cast<double>(src[i]) * factor));
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void scaleHalf(uint16_t* dst, const uint16_t* src, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) dst[i] = FromF(ToF(src[i]) * f);
}

template <typename T, typename Acc, Acc (*Load)(T), T (*Store)(Acc)>
void reduceManyTyped(ReduceOp op, T* out, const void* const* inputs, int n, size_t count) {
  constexpr size_t kBlock = 1024;
  Acc acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* first = static_cast<const T*>(inputs[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = Load(first[i]);
    for (int j = 1; j < n; ++j) {
      const T* in = static_cast<const T*>(inputs[j]) + base;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage:
          for (size_t i = 0; i < m; ++i) acc[i] += Load(in[i]);
          break;
        case ReduceOp::kMin:
          for (size_t i = 0; i < m; ++i) acc[i] = std::min(acc[i], Load(in[i]));
          break;
        case ReduceOp::kMax:
          for (size_t i = 0; i < m; ++i) acc[i] = std::max(acc[i], Load(in[i]));
          break;
        case ReduceOp::kProduct:
          for (size_t i = 0; i < m; ++i) acc[i] *= Load(in[i]);
          break;
      }
    }
    for (size_t i = 0; i < m; ++i) out[base + i] = Store(acc[i]);
  }
}

template <typename T>
T same(T v) {
  return v;
}
float loadHalf(uint16_t v) { return halfToFloat(v); }
uint16_t storeHalf(float v) { return floatToHalf(v); }
float loadBf16(uint16_t v) { return bf16ToFloat(v); }
uint16_t storeBf16(float v) { return floatToBf16(v); }

}  // namespace

void reduceMany(DataType dtype, ReduceOp op, void* out, const void* const* inputs, int n, size_t count) {
  switch (dtype) {
    case DataType::kUInt8:
      return reduceManyTyped<uint8_t, uint8_t, same, same>(op, static_cast<uint8_t*>(out), inputs, n, count);
    case DataType::kInt8:
      return reduceManyTyped<int8_t, int8_t, same, same>(op, static_cast<int8_t*>(out), inputs, n, count);
    case DataType::kInt32:
      return reduceManyTyped<int32_t, int32_t, same, same>(op, static_cast<int32_t*>(out), inputs, n, count);
    case DataType::kInt64:
      return reduceManyTyped<int64_t, int64_t, same, same>(op, static_cast<int64_t*>(out), inputs, n, count);
    case DataType::kFloat32:
      return reduceManyTyped<float, float, same, same>(op, static_cast<float*>(out), inputs, n, count);
    case DataType::kFloat64:
      return reduceManyTyped<double, double, same, same>(op, static_cast<double*>(out), inputs, n, count);
    case DataType::kFloat16:
      return reduceManyTyped<uint16_t, float, loadHalf, storeHalf>(op, static_cast<uint16_t*>(out), inputs, n, count);
    case DataType::kBFloat16:
      return reduceManyTyped<uint16_t, float, loadBf16, storeBf16>(op, static_cast<uint16_t*>(out), inputs, n, count);
    case DataType::kBool: {
      // For 0/1 values, or is max and and is min.
      const bool isOr = op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kMax;
      return reduceManyTyped<uint8_t, uint8_t, same, same>(isOr ? ReduceOp::kMax : ReduceOp::kMin,
                                                           static_cast<uint8_t*>(out), inputs, n, count);
    }
  }
}

void reduceBuffers(DataType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DataType::kUInt8:
      return reduceTyped(op, static_cast<uint8_t*>(out), static_cast<const uint8_t*>(a),
                         static_cast<const uint8_t*>(b), n);
    case DataType::kInt8:
      return reduceTyped(op, static_cast<int8_t*>(out), static_cast<const int8_t*>(a),
                         static_cast<const int8_t*>(b), n);
    case DataType::kInt32:
      return reduceTyped(op, static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                         static_cast<const int32_t*>(b), n);
    case DataType::kInt64:
      return reduceTyped(op, static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                         static_cast<const int64_t*>(b), n);
    case DataType::kFloat32:
      return reduceTyped(op, static_cast<float*>(out), static_cast<const float*>(a),
                         static_cast<const float*>(b), n);
    case DataType::kFloat64:
      return reduceTyped(op, static_cast<double*>(out), static_cast<const double*>(a),
                         static_cast<const double*>(b), n);
    case DataType::kFloat16:
      return reduceHalf<halfToFloat, floatToHalf>(op, static_cast<uint16_t*>(out),
                                                  static_cast<const uint16_t*>(a),
                                                  static_cast<const uint16_t*>(b), n);
    case DataType::kBFloat16:
      return reduceHalf<bf16ToFloat, floatToBf16>(op, static_cast<uint16_t*>(out),
                                                  static_cast<const uint16_t*>(a),
                                                  static_cast<const uint16_t*>(b), n);
    case DataType::kBool:
      return reduceBool(op, static_cast<uint8_t*>(out), static_cast<const uint8_t*>(a),
                        static_cast<const uint8_t*>(b), n);
  }
}

void scaleCopy(DataType dtype, void* dst, const void* src, size_t n, double factor) {
  if (factor == 1.0 || dtype == DataType::kBool) {
    if (dst != src && n) std::memmove(dst, src, n * dtypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8:
      return scaleTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, factor);
    case DataType::kInt8:
      return scaleTyped(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, factor);
    case DataType::kInt32:
      return scaleTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, factor);
    case DataType::kInt64:
      return scaleTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, factor);
    case DataType::kFloat32:
      return scaleTyped(static_cast<float*>(dst), static_cast<const float*>(src), n, factor);
    case DataType::kFloat64:
      return scaleTyped(static_cast<double*>(dst), static_cast<const double*>(src), n, factor);
    case DataType::kFloat16:
      return scaleHalf<halfToFloat, floatToHalf>(static_cast<uint16_t*>(dst),
                                                 static_cast<const uint16_t*>(src), n, factor);
    case DataType::kBFloat16:
      return scaleHalf<bf16ToFloat, floatToBf16>(static_cast<uint16_t*>(dst),
                                                 static_cast<const uint16_t*>(src), n, factor);
    case DataType::kBool:
      return;
  }
}

template <typename T>
void divideTyped(T* buf, size_t n, int64_t d) {
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<int64_t>(buf[i]) / d);
}

void divideBuffer(DataType dtype, void* buf, size_t n, int64_t divisor) {
  switch (dtype) {
    case DataType::kUInt8: return divideTyped(static_cast<uint8_t*>(buf), n, divisor);
    case DataType::kInt8: return divideTyped(static_cast<int8_t*>(buf), n, divisor);
    case DataType::kInt32: return divideTyped(static_cast<int32_t*>(buf), n, divisor);
    case DataType::kInt64: return divideTyped(static_cast<int64_t*>(buf), n, divisor);
    default: return scaleBuffer(dtype, buf, n, 1.0 / static_cast<double>(divisor));
  }
}

void scaleBuffer(DataType dtype, void* buf, size_t n, double factor) {
  scaleCopy(dtype, buf, buf, n, factor);
}

}  // namespace chorus
