#include "chorus/types.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "chorus/error.h"

namespace chorus {

std::string deviceName(int32_t device) { return device < 0 ? "cpu" : "cuda:" + std::to_string(device); }

size_t dtypeSize(DataType t) {
  switch (t) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kInt16:
    case DataType::kUInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

const char* dtypeName(DataType t) {
  switch (t) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
    case DataType::kInt16: return "int16";
    case DataType::kUInt16: return "uint16";
  }
  return "unknown";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kAdasum: return "adasum";
  }
  return "unknown";
}

static std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

DataType parseDataType(const std::string& name) {
  const std::string n = lower(name);
  if (n == "uint8" || n == "u8") return DataType::kUInt8;
  if (n == "int8" || n == "i8") return DataType::kInt8;
  if (n == "int16" || n == "short" || n == "i16") return DataType::kInt16;
  if (n == "uint16" || n == "u16") return DataType::kUInt16;
  if (n == "int32" || n == "int" || n == "i32") return DataType::kInt32;
  if (n == "int64" || n == "long" || n == "i64") return DataType::kInt64;
  if (n == "float16" || n == "half" || n == "fp16") return DataType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DataType::kBFloat16;
  if (n == "float32" || n == "float" || n == "fp32") return DataType::kFloat32;
  if (n == "float64" || n == "double" || n == "fp64") return DataType::kFloat64;
  if (n == "bool") return DataType::kBool;
  throw InvalidArgument("unknown dtype '" + name +
                        "' (expected uint8, int8, int16, uint16, int32, int64, float16, bfloat16, float32, "
                        "float64 or bool)");
}

ReduceOp parseReduceOp(const std::string& name) {
  const std::string n = lower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "avg" || n == "average" || n == "mean") return ReduceOp::kAverage;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "prod" || n == "product") return ReduceOp::kProduct;
  if (n == "adasum") return ReduceOp::kAdasum;
  throw InvalidArgument("unknown reduce op '" + name + "' (expected sum, avg, min, max, prod or adasum)");
}

int64_t numElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shapeString(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace chorus
