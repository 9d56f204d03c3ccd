#pragma once
// The node's memory floors. For a collective of S bytes per rank: the time for
// every rank to memcpy S bytes at once (read S + write S each, 2nS in all,
// which is what an allreduce must move at least); for an allgather, its own.
#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "chorus/chorus.h"
#include "comm/shm/stream_copy.h"

namespace chorus::bench {

// Runs copy(i) on every rank at once, iters times: the slowest rank defines
// each concurrent run, and the best run is kept.
template <typename Copy>
double bestConcurrentMicros(Runtime& rt, int iters, Copy&& copy) {
  double best = 1e300;
  for (int i = 0; i < iters; ++i) {
    rt.barrier();
    auto t0 = std::chrono::steady_clock::now();
    copy(i);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    AllreduceOptions o;
    o.op = ReduceOp::kMax;
    o.name = "bench.floor";
    rt.allreduce(Tensor{&us, DataType::kFloat64, {1}}, Tensor{&us, DataType::kFloat64, {1}}, o);
    best = std::min(best, us);
  }
  return best;
}

inline double concurrentMemcpyMicros(Runtime& rt, size_t bytes, int iters, int sets) {
  if (bytes == 0) return 0;
  std::vector<std::vector<char>> src(sets, std::vector<char>(bytes, 1)), dst(sets, std::vector<char>(bytes, 0));
  return bestConcurrentMicros(rt, iters, [&](int i) { std::memcpy(dst[i % sets].data(), src[i % sets].data(), bytes); });
}

// An allgather's own floor for an output of `bytes` over n ranks: every rank
// reads its piece and streams it (non-temporal stores, no read for ownership)
// into each of the n places of a private output, all ranks at once. Any
// allgather into separate private buffers moves at least this through memory,
// with the exchange between the ranks for free (the input is read once for
// every two places).
inline double concurrentGatherMicros(Runtime& rt, size_t bytes, int iters, int sets) {
  const int n = rt.size();
  const size_t piece = bytes / n;
  if (piece == 0) return 0;
  std::vector<std::vector<char>> src(sets, std::vector<char>(piece, 1)), dst(sets, std::vector<char>(piece * n, 0));
  return bestConcurrentMicros(rt, iters, [&](int i) {
    char* out = dst[i % sets].data();
    for (int j = 0; j < n; j += 2)
      streamCopy(out + j * piece, src[i % sets].data(), piece, j + 1 < n ? out + (j + 1) * piece : nullptr, true);
    _mm_sfence();
  });
}

}  // namespace chorus::bench
