#pragma once
// Helpers shared by the executor's op runners and its scheduler.
#include <vector>

#include "core/message.h"
#include "reduce/reduce.h"

namespace chorus {

// Allreduces that may travel in one fused collective.
inline bool fusible(const Response& a, const Response& b) {
  return a.type == OpType::kAllreduce && b.type == OpType::kAllreduce &&
         a.errorKind == ErrorKind::kNone && b.errorKind == ErrorKind::kNone && a.dtype == b.dtype && a.onDevice == b.onDevice &&
         a.op == b.op && a.prescale == b.prescale && a.postscale == b.postscale;
}

inline bool isInteger(DataType t) {
  return t == DataType::kUInt8 || t == DataType::kInt8 || t == DataType::kInt16 || t == DataType::kUInt16 ||
         t == DataType::kInt32 || t == DataType::kInt64;
}

// What rank `me` of n sends to and receives from each rank in an alltoall
// (bytes), the rows it receives from each, and their total.
struct AlltoallPlan {
  std::vector<size_t> sendBytes, recvBytes;
  std::vector<int64_t> received;
  int64_t rows = 0;
};
inline AlltoallPlan alltoallPlan(const Response& r, int n, int me, size_t rowBytes) {
  AlltoallPlan p;
  p.sendBytes.resize(n);
  p.recvBytes.resize(n);
  p.received.resize(n);
  for (int j = 0; j < n; ++j) {
    p.sendBytes[j] = static_cast<size_t>(r.splits[me][j]) * rowBytes;
    p.received[j] = r.splits[j][me];
    p.recvBytes[j] = static_cast<size_t>(p.received[j]) * rowBytes;
    p.rows += p.received[j];
  }
  return p;
}

// Postscale, then Average's division by the set size (exact for integers:
// truncating division, as C++ and torch's trunc rounding do).
inline void postProcess(const Response& r, void* buf, size_t n, int size) {
  if (r.op != ReduceOp::kAverage) return scaleBuffer(r.dtype, buf, n, r.postscale);
  if (isInteger(r.dtype)) {
    scaleBuffer(r.dtype, buf, n, r.postscale);
    return divideBuffer(r.dtype, buf, n, size);
  }
  scaleBuffer(r.dtype, buf, n, r.postscale / size);
}

// The factor postProcess would apply, for a floating dtype (the transport
// applies it, as it reduces where it can); 0 for integers, whose Average
// divides apart.
inline double foldedScale(const Response& r, int size) {
  if (!isFloating(r.dtype)) return 0;
  return r.op == ReduceOp::kAverage ? r.postscale / size : r.postscale;
}

}  // namespace chorus
