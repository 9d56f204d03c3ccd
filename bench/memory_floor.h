#pragma once
// The node's memory floor for a collective of S bytes per rank: the time for
// every rank to memcpy S bytes at once (read S + write S each, 2nS in all,
// which is what an allreduce must move at least).
#include <chrono>
#include <cstring>
#include <vector>

#include "chorus/chorus.h"

namespace chorus::bench {

inline double concurrentMemcpyMicros(Runtime& rt, size_t bytes, int iters, int sets) {
  if (bytes == 0) return 0;
  std::vector<std::vector<char>> src(sets, std::vector<char>(bytes, 1)), dst(sets, std::vector<char>(bytes, 0));
  double best = 1e300;
  for (int i = 0; i < iters; ++i) {
    rt.barrier();
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst[i % sets].data(), src[i % sets].data(), bytes);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    // The slowest rank defines the concurrent copy; keep the best iteration.
    AllreduceOptions o;
    o.op = ReduceOp::kMax;
    o.name = "bench.floor";
    rt.allreduce(Tensor{&us, DataType::kFloat64, {1}}, Tensor{&us, DataType::kFloat64, {1}}, o);
    best = std::min(best, us);
  }
  return best;
}

}  // namespace chorus::bench
