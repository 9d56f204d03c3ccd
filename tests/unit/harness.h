#pragma once
// Runs N ranks as threads of this process, each with its own Runtime, over the
// real TCP transport and a shared in-memory store. Exceptions from every rank
// are collected and reported.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus::testing {

struct RankContext {
  int rank;
  int size;
  Runtime& rt;
};

using ConfigTweak = std::function<void(Config&)>;

// Runs fn on every rank after init, then shuts down. Returns each rank's error text ("" = ok).
std::vector<std::string> runRanks(int size, const std::function<void(RankContext&)>& fn,
                                  const ConfigTweak& tweak = nullptr);

// Same, but fails the current gtest on any error.
void runRanksOk(int size, const std::function<void(RankContext&)>& fn, const ConfigTweak& tweak = nullptr);

// Deterministic test data, exactly representable in every dtype.
double testValue(int rank, int64_t i, DataType dtype, ReduceOp op);
// Element i of the reduction of every rank's testValue, computed in double.
double reference(ReduceOp op, DataType dtype, int n, int64_t i);

// Typed buffers read and written as double.
class HostBuffer {
 public:
  HostBuffer(DataType dtype, Shape shape);
  Tensor tensor() { return Tensor{data_.data(), dtype_, shape_}; }
  double get(int64_t i) const;
  void set(int64_t i, double v);
  int64_t numel() const { return numElements(shape_); }

 private:
  DataType dtype_;
  Shape shape_;
  std::vector<char> data_;
};
double readAs(const void* data, DataType dtype, int64_t i);
// v after a round trip through dtype (what a copy of v in that dtype reads back as).
double representable(DataType dtype, double v);

// Tolerance for comparing a dtype's result with a float64 reference.
double tolerance(DataType dtype, double expected);

extern const std::vector<DataType> kAllDtypes;

}  // namespace chorus::testing
