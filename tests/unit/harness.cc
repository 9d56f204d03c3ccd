#include "harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <cstring>
#include <thread>

#include "reduce/cast.h"

namespace chorus::testing {

const std::vector<DataType> kAllDtypes = {DataType::kUInt8,   DataType::kInt8,     DataType::kInt32,
                                          DataType::kInt64,   DataType::kFloat16,  DataType::kBFloat16,
                                          DataType::kFloat32, DataType::kFloat64,  DataType::kBool,
                                          DataType::kInt16,   DataType::kUInt16};

std::vector<std::string> runRanks(int size, const std::function<void(RankContext&)>& fn,
                                  const ConfigTweak& tweak) {
  auto store = makeMemoryStore();
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Runtime rt;
      try {
        Config c;
        c.rank = r;
        c.size = size;
        c.store = store;
        c.hostname = "testhost";
        c.timeoutSeconds = 20;
        c.startTimeoutSeconds = 20;
        if (tweak) tweak(c);
        rt.init(c);
        RankContext ctx{r, size, rt};
        fn(ctx);
        rt.shutdown();
      } catch (const std::exception& e) {
        errors[r] = e.what();
        try {
          rt.shutdown();
        } catch (...) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void runRanksOk(int size, const std::function<void(RankContext&)>& fn, const ConfigTweak& tweak) {
  auto errors = runRanks(size, fn, tweak);
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " of " << size;
}

double testValue(int rank, int64_t i, DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) return ((i + rank) % 3 == 0) ? 1 : 0;
  if (op == ReduceOp::kProduct) return 1 + (i + rank) % 2;  // products stay small
  if (dtype == DataType::kUInt8 || dtype == DataType::kUInt16) return static_cast<double>((i * 3 + rank * 5) % 11);
  const double v = static_cast<double>((i * 3 + rank * 5) % 11 - 5);
  const bool isFloat = dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
                       dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
  return isFloat ? v * 0.5 : v;
}

double reference(ReduceOp op, DataType dtype, int n, int64_t i) {
  if (dtype == DataType::kBool) {
    bool any = false, all = true;
    for (int r = 0; r < n; ++r) {
      bool v = testValue(r, i, dtype, op) != 0;
      any |= v;
      all &= v;
    }
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? all : any;
  }
  double acc = testValue(0, i, dtype, op);
  for (int r = 1; r < n; ++r) {
    double v = testValue(r, i, dtype, op);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc += v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kAdasum: throw std::logic_error("Adasum has no element-wise expected value");
    }
  }
  if (op == ReduceOp::kAverage) {
    const bool integer = dtype == DataType::kUInt8 || dtype == DataType::kInt8 || dtype == DataType::kInt16 ||
                         dtype == DataType::kUInt16 ||
                         dtype == DataType::kInt32 || dtype == DataType::kInt64;
    acc = integer ? std::floor(acc / n) : acc / n;  // an integer average rounds down
  }
  return acc;
}

HostBuffer::HostBuffer(DataType dtype, Shape shape)
    : dtype_(dtype), shape_(std::move(shape)), data_(std::max<size_t>(numElements(shape_) * dtypeSize(dtype), 1)) {}

double readAs(const void* data, DataType dtype, int64_t i) {
  return elementToDouble(data, dtype, static_cast<size_t>(i));
}

double representable(DataType dtype, double v) {
  HostBuffer one(dtype, {1});
  one.set(0, v);
  return one.get(0);
}

double HostBuffer::get(int64_t i) const { return readAs(data_.data(), dtype_, i); }

void HostBuffer::set(int64_t i, double v) { elementFromDouble(data_.data(), dtype_, static_cast<size_t>(i), v); }

double tolerance(DataType dtype, double expected) {
  const double mag = std::max(1.0, std::fabs(expected));
  switch (dtype) {
    case DataType::kFloat16: return 2e-3 * mag;
    case DataType::kBFloat16: return 1.6e-2 * mag;
    case DataType::kFloat32: return 1e-6 * mag;
    case DataType::kFloat64: return 1e-12 * mag;
    default: return 0;
  }
}

}  // namespace chorus::testing
