// chorus-kernel-bench: the reduction kernels of one instruction set (CHORUS_SIMD
// = avx512, avx2 or generic; the CPU's best by default) on data in cache and
// in memory, beside memcpy of the same output: a regression in the code GCC
// makes for a kernel shows here before it hides in a collective's noise.
//   CHORUS_SIMD=avx2 ./build/chorus-kernel-bench --benchmark_filter=float32
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "chorus/types.h"
#include "reduce/reduce.h"

namespace {

using chorus::DataType;

constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16, DataType::kFloat64,
                               DataType::kInt32, DataType::kUInt8};

struct Buffers {
  Buffers(DataType dt, int inputs, size_t count) : bytes(count * chorus::dtypeSize(dt)) {
    for (int j = 0; j < inputs; ++j) in.emplace_back(bytes + 64, static_cast<char>(1 + j));
    for (auto& b : in) ptrs.push_back(aligned(b.data()));
    out.assign(bytes + 64, 0);
  }
  static char* aligned(char* p) { return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64; }
  size_t bytes;
  std::vector<std::vector<char>> in;
  std::vector<const void*> ptrs;
  std::vector<char> out;
};

// args: dtype index, inputs, elements
void reduceMany(benchmark::State& state) {
  const DataType dt = kTypes[state.range(0)];
  const int n = static_cast<int>(state.range(1));
  Buffers b(dt, n, static_cast<size_t>(state.range(2)));
  char* out = Buffers::aligned(b.out.data());
  for (auto _ : state) {
    chorus::reduceMany(dt, chorus::ReduceOp::kSum, out, b.ptrs.data(), n, static_cast<size_t>(state.range(2)));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * b.bytes * (n + 1)));
  state.SetLabel(std::string(chorus::dtypeName(dt)) + " " + chorus::simdLevel());
}

void reduceManyStreamed(benchmark::State& state) {
  const DataType dt = kTypes[state.range(0)];
  const int n = static_cast<int>(state.range(1));
  Buffers b(dt, n, static_cast<size_t>(state.range(2)));
  void* outs[1] = {Buffers::aligned(b.out.data())};
  for (auto _ : state) {
    chorus::reduceManyStreamed(dt, chorus::ReduceOp::kSum, nullptr, outs, 1, b.ptrs.data(), n,
                               static_cast<size_t>(state.range(2)));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * b.bytes * (n + 1)));
  state.SetLabel(std::string(chorus::dtypeName(dt)) + " " + chorus::simdLevel());
}

// The peer: copying the output's bytes (one input read, one output written).
void copyOutput(benchmark::State& state) {
  const DataType dt = kTypes[state.range(0)];
  Buffers b(dt, 1, static_cast<size_t>(state.range(2)));
  char* out = Buffers::aligned(b.out.data());
  for (auto _ : state) {
    std::memcpy(out, b.ptrs[0], b.bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * b.bytes * 2));
  state.SetLabel(std::string(chorus::dtypeName(dt)) + " memcpy");
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t t = 0; t < static_cast<int64_t>(std::size(kTypes)); ++t)
    for (int64_t elements : {int64_t{16} << 10, int64_t{4} << 20})  // in cache, in memory
      for (int64_t n : {2, 4}) b->Args({t, n, elements});
}

BENCHMARK(reduceMany)->Apply(shapes);
BENCHMARK(reduceManyStreamed)->Apply(shapes);
BENCHMARK(copyOutput)->Apply([](benchmark::internal::Benchmark* b) {
  for (int64_t t = 0; t < static_cast<int64_t>(std::size(kTypes)); ++t)
    for (int64_t elements : {int64_t{16} << 10, int64_t{4} << 20}) b->Args({t, 1, elements});
});

}  // namespace

BENCHMARK_MAIN();
