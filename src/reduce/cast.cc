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

double elementToDouble(const void* data, DataType dtype, size_t i) {
  switch (dtype) {
    case DataType::kUInt8: return static_cast<const uint8_t*>(data)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(data)[i];
    case DataType::kInt16: return static_cast<const int16_t*>(data)[i];
    case DataType::kUInt16: return static_cast<const uint16_t*>(data)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(data)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DataType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DataType::kBFloat16: return bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DataType::kFloat32: return static_cast<const float*>(data)[i];
    case DataType::kFloat64: return static_cast<const double*>(data)[i];
    case DataType::kBool: return static_cast<const uint8_t*>(data)[i];
  }
  throw InvalidArgument("elementToDouble: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

void elementFromDouble(void* data, DataType dtype, size_t i, double v) {
  switch (dtype) {
    case DataType::kUInt8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); return;
    case DataType::kInt8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v); return;
    case DataType::kInt16: static_cast<int16_t*>(data)[i] = static_cast<int16_t>(v); return;
    case DataType::kUInt16: static_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(v); return;
    case DataType::kInt32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); return;
    case DataType::kInt64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); return;
    case DataType::kFloat16: static_cast<uint16_t*>(data)[i] = floatToHalf(static_cast<float>(v)); return;
    case DataType::kBFloat16: static_cast<uint16_t*>(data)[i] = floatToBf16(static_cast<float>(v)); return;
    case DataType::kFloat32: static_cast<float*>(data)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(data)[i] = v; return;
    case DataType::kBool: static_cast<uint8_t*>(data)[i] = v != 0 ? 1 : 0; return;
  }
  throw InvalidArgument("elementFromDouble: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

void castElements(DataType to, void* dst, DataType from, const void* src, size_t n) {
  for (size_t i = 0; i < n; ++i) elementFromDouble(dst, to, i, elementToDouble(src, from, i));
}

}  // namespace chorus
