// Large allreduces run in chunks with a negotiation between two: an op of
// higher priority that becomes ready meanwhile completes first, and chunked
// results equal the reduction computed apart (fused tensors of odd sizes,
// scaled, integer Average).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>

#include "harness.h"
#include "reduce/reduce.h"

namespace chorus::testing {
namespace {

class Preemption : public ::testing::TestWithParam<std::string> {
 protected:
  ConfigTweak tweak(int64_t chunk) const {
    return [chunk, ops = GetParam()](Config& c) {
      c.cpuOperations = ops;
      c.preemptChunkBytes = chunk;
    };
  }
};

// Which of the two ops finished first, on each rank: "small" or "large".
std::vector<std::string> firstToFinish(const ConfigTweak& tweak) {
  std::vector<std::string> first(2);
  runRanksOk(2, [&](RankContext& c) {
    std::vector<float> large(8 << 20, 1.0f + c.rank), largeOut(large.size());  // 32 MiB
    std::vector<float> small(2048, 2.0f * c.rank), smallOut(small.size());
    AllreduceOptions lo, hi;
    lo.op = hi.op = ReduceOp::kSum;
    lo.name = "large";
    hi.name = "small";
    hi.priority = 10;
    std::mutex mu;
    auto record = [&](const char* name) {
      std::lock_guard<std::mutex> lock(mu);
      if (first[c.rank].empty()) first[c.rank] = name;
    };
    const int64_t before = c.rt.stats().allreduceBatches;
    Work big = c.rt.allreduceAsync(Tensor{large.data(), DataType::kFloat32, {static_cast<int64_t>(large.size())}},
                                   Tensor{largeOut.data(), DataType::kFloat32, {static_cast<int64_t>(large.size())}}, lo);
    big.whenDone([&] { record("large"); });
    // Once the large op has started here (its first chunk, or all of it).
    while (c.rt.stats().allreduceBatches == before) std::this_thread::yield();
    Work w = c.rt.allreduceAsync(Tensor{small.data(), DataType::kFloat32, {static_cast<int64_t>(small.size())}},
                                 Tensor{smallOut.data(), DataType::kFloat32, {static_cast<int64_t>(small.size())}}, hi);
    w.whenDone([&] { record("small"); });
    w.wait();
    big.wait();
    EXPECT_EQ(smallOut[7], 2.0f);
    EXPECT_EQ(largeOut.front(), 3.0f);
    EXPECT_EQ(largeOut.back(), 3.0f);
  }, tweak);
  return first;
}

TEST_P(Preemption, AHigherPriorityOpGoesBetweenTheChunksOfALargeOne) {
  // 32 MiB in 16 KiB chunks: a thousand negotiations, of which the small op
  // takes one of the first.
  EXPECT_EQ(firstToFinish(tweak(16 << 10)), (std::vector<std::string>{"small", "small"}));
  // Whole, the large op runs to its end first (what the test would see broken).
  EXPECT_EQ(firstToFinish(tweak(0)), (std::vector<std::string>{"large", "large"}));
}

TEST_P(Preemption, ChunkedFusedResultsEqualTheReduction) {
  const std::vector<int64_t> sizes = {1, 1000, 5003, 3, 20011, 0, 777};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat64}) {
      runRanksOk(3, [&](RankContext& c) {
        std::vector<HostBuffer> in, out;
        for (int64_t n : sizes) {
          in.emplace_back(dt, Shape{n});
          out.emplace_back(dt, Shape{n});
          for (int64_t i = 0; i < n; ++i) in.back().set(i, testValue(c.rank, i, dt, op));
        }
        std::vector<Tensor> ins, outs;
        for (size_t k = 0; k < sizes.size(); ++k) {
          ins.push_back(in[k].tensor());
          outs.push_back(out[k].tensor());
        }
        AllreduceOptions o;
        o.op = op;
        o.name = "fused";
        o.postscaleFactor = isFloating(dt) ? 0.5 : 1.0;
        c.rt.groupedAllreduceAsync(ins, outs, o).wait();
        for (size_t k = 0; k < sizes.size(); ++k)
          for (int64_t i = 0; i < sizes[k]; ++i) {
            const double want = reference(op, dt, 3, i) * o.postscaleFactor;
            ASSERT_NEAR(out[k].get(i), want, 1e-5 * std::max(1.0, std::abs(want)))
                << dtypeName(dt) << " tensor " << k << " element " << i;
          }
      }, tweak(4 << 10));  // 4 KiB chunks: every tensor boundary falls inside some chunk
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Preemption, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace chorus::testing
