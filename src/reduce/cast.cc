#include "reduce/cast.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "chorus/error.h"
#include "reduce/half.h"

namespace chorus {

void toFloat(float* dst, const void* src, DataType dtype, size_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (dtype == DataType::kFloat32) {
    std::memcpy(dst, src, n * 4);
  } else if (dtype == DataType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16ToFloat(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = halfToFloat(s[i]);
  }
}

void fromFloat(void* dst, const float* src, DataType dtype, size_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DataType::kFloat32) {
    std::memcpy(dst, src, n * 4);
  } else if (dtype == DataType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) d[i] = floatToBf16(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = floatToHalf(src[i]);
  }
}

double sumSquares(const void* grad, DataType dtype, size_t n) {
  double total = 0.0;
  const int64_t blocks = static_cast<int64_t>((n + 65535) / 65536);
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t off = static_cast<size_t>(b) * 65536, len = std::min<size_t>(65536, n - off);
    float buf[1024];
    double acc = 0.0;
    for (size_t i = 0; i < len; i += 1024) {
      const size_t m = std::min<size_t>(1024, len - i);
      const void* src = static_cast<const char*>(grad) + (off + i) * dtypeSize(dtype);
      toFloat(buf, src, dtype, m);
      float part = 0.0f;
      for (size_t k = 0; k < m; ++k) part += buf[k] * buf[k];
      acc += part;
    }
    total += acc;
  }
  return total;
}

void castElements(DataType to, void* dst, DataType from, const void* src, size_t n) {
  auto load = [&](size_t i) -> double {
    switch (from) {
      case DataType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(src)[i]);
      case DataType::kBFloat16: return bf16ToFloat(static_cast<const uint16_t*>(src)[i]);
      case DataType::kFloat32: return static_cast<const float*>(src)[i];
      case DataType::kFloat64: return static_cast<const double*>(src)[i];
      default: throw InvalidArgument(std::string("cast: unsupported source dtype ") + dtypeName(from));
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const double v = load(i);
    switch (to) {
      case DataType::kFloat16: static_cast<uint16_t*>(dst)[i] = floatToHalf(static_cast<float>(v)); break;
      case DataType::kBFloat16: static_cast<uint16_t*>(dst)[i] = floatToBf16(static_cast<float>(v)); break;
      case DataType::kFloat32: static_cast<float*>(dst)[i] = static_cast<float>(v); break;
      case DataType::kFloat64: static_cast<double*>(dst)[i] = v; break;
      default: throw InvalidArgument(std::string("cast: unsupported target dtype ") + dtypeName(to));
    }
  }
}

}  // namespace chorus
