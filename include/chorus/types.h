#pragma once
// Data types, reduce ops and the tensor view that every collective takes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kBool = 8,
  kInt16 = 9,
  kUInt16 = 10,
};
inline constexpr int kNumDataTypes = 11;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  // Adaptive summation (Horovod's Adasum): floating dtypes, allreduce only.
  kAdasum = 5,
};

size_t dtypeSize(DataType t);
const char* dtypeName(DataType t);
const char* reduceOpName(ReduceOp op);
// Parses "float32", "fp32", "float", "int64", "bf16", ... Throws InvalidArgument.
DataType parseDataType(const std::string& name);
ReduceOp parseReduceOp(const std::string& name);

using Shape = std::vector<int64_t>;
int64_t numElements(const Shape& shape);
std::string shapeString(const Shape& shape);

// Where a tensor's memory is: kHostDevice, else a CUDA device ordinal.
inline constexpr int32_t kHostDevice = -1;

// A non-owning view of a dense, contiguous tensor, in host memory or, with
// device >= 0, in that CUDA device's memory.
struct Tensor {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  Shape shape;
  int32_t device = kHostDevice;

  int64_t numel() const { return numElements(shape); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype); }
};

template <typename T>
Tensor makeTensor(T* data, Shape shape, DataType dtype, int32_t device = kHostDevice) {
  return Tensor{static_cast<void*>(data), dtype, std::move(shape), device};
}

// "cpu" or "cuda:N", for messages.
std::string deviceName(int32_t device);

}  // namespace chorus
