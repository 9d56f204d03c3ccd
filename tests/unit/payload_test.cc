// A lone cached small allreduce travels with the negotiation over shared memory
// (one round instead of two): used only when every rank sent the same op, and
// with the same results as the two-round path.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "harness.h"

namespace chorus::testing {
namespace {

void shm(Config& c) { c.cpuOperations = "shm"; }

AllreduceOptions named(const std::string& name, ReduceOp op = ReduceOp::kSum) {
  AllreduceOptions o;
  o.op = op;
  o.name = name;
  return o;
}

// Repeated synchronous allreduces of one name: after the first (negotiated) one,
// each goes with its negotiation, in and out of place, for every dtype and op.
TEST(Payload, RepeatedSmallAllreducesGoWithTheNegotiation) {
  for (int n : {2, 3}) {
    runRanksOk(n, [&](RankContext& c) {
      const int64_t count = 1031;
      for (DataType dt : kAllDtypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
          const std::string name = std::string("p.") + dtypeName(dt) + reduceOpName(op);
          const auto before = c.rt.stats();
          for (int step = 0; step < 4; ++step) {
            const bool inPlace = step % 2 == 0;
            HostBuffer in(dt, {count}), out(dt, {count});
            // Data that differs by step, so a stale payload would show.
            for (int64_t i = 0; i < count; ++i) in.set(i, testValue(c.rank, i + step, dt, op));
            c.rt.allreduce(in.tensor(), inPlace ? in.tensor() : out.tensor(), named(name, op));
            const HostBuffer& got = inPlace ? in : out;
            for (int64_t i = 0; i < count; ++i) {
              const double want = reference(op, dt, n, i + step);
              ASSERT_NEAR(got.get(i), want, tolerance(dt, want))
                  << dtypeName(dt) << " " << reduceOpName(op) << " step " << step << " i " << i;
            }
          }
          // The first use is negotiated; the three repeats go with their negotiation.
          EXPECT_EQ(c.rt.stats().payloadOps - before.payloadOps, 3) << dtypeName(dt) << " " << reduceOpName(op);
        }
      }
    }, shm);
  }
}

// Every rank must end with the same bits: float32 sums whose value depends on the
// order of addition.
TEST(Payload, EveryRankGetsTheSameBits) {
  const int n = 3;
  std::vector<std::vector<float>> results(n);
  runRanksOk(n, [&](RankContext& c) {
    std::vector<float> v(257);
    for (int step = 0; step < 3; ++step) {
      const float scale = c.rank == 0 ? 1e8f : c.rank == 1 ? 1.37f : -3e7f;  // rounding depends on the order
      for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (0.1f + i * 1e-3f + step);
      Tensor t{v.data(), DataType::kFloat32, {static_cast<int64_t>(v.size())}};
      c.rt.allreduce(t, t, named("bits"));
    }
    results[c.rank] = v;
  }, shm);
  for (int r = 1; r < n; ++r)
    ASSERT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].size() * sizeof(float)), 0) << "rank " << r;
}

// Ranks whose pending ops differ (each submits three names in its own order,
// with pauses between) must not use a payload that others did not send.
TEST(Payload, RanksWithDifferentPendingOpsStayCorrect) {
  runRanksOk(3, [&](RankContext& c) {
    std::mt19937 rng(c.rank * 131 + 7);
    for (int step = 0; step < 60; ++step) {
      std::vector<int> order(3);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<HostBuffer> bufs(3, HostBuffer(DataType::kInt64, {5}));
      std::vector<std::optional<Work>> works(3);
      for (int t : order) {
        for (int i = 0; i < 5; ++i) bufs[t].set(i, c.rank * 1000 + step * 10 + t + i);
        works[t].emplace(c.rt.allreduceAsync(bufs[t].tensor(), bufs[t].tensor(), named("d" + std::to_string(t))));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      }
      for (auto& w : works) w->wait();
      for (int t = 0; t < 3; ++t)
        for (int i = 0; i < 5; ++i) ASSERT_EQ(bufs[t].get(i), 3000 + 3 * (step * 10 + t + i)) << "step " << step;
    }
  }, shm);
}

// Prescaled ops and ops larger than a payload take the two-round path.
TEST(Payload, PrescaledAndLargeOpsDoNotGoWithTheNegotiation) {
  runRanksOk(2, [&](RankContext& c) {
    const auto before = c.rt.stats();
    for (int step = 0; step < 3; ++step) {
      HostBuffer a(DataType::kFloat64, {8});
      for (int i = 0; i < 8; ++i) a.set(i, c.rank + i + step);
      AllreduceOptions o = named("scaled");
      o.prescaleFactor = 0.5;
      c.rt.allreduce(a.tensor(), a.tensor(), o);
      for (int i = 0; i < 8; ++i) ASSERT_EQ(a.get(i), 0.5 * (1 + 2 * (i + step)));
      HostBuffer b(DataType::kFloat32, {8192});  // 32 KiB
      for (int i = 0; i < 8192; ++i) b.set(i, c.rank + (i % 100) + step);
      c.rt.allreduce(b.tensor(), b.tensor(), named("large"));
      for (int i = 0; i < 8192; i += 7) ASSERT_EQ(b.get(i), 1 + 2 * ((i % 100) + step));
    }
    EXPECT_EQ(c.rt.stats().payloadOps, before.payloadOps);
  }, shm);
}

}  // namespace
}  // namespace chorus::testing
