// A lone cached small op travels with the negotiation over shared memory (one
// round instead of two or more): used only when every rank sent the same op, and
// with the same results as the negotiated path.
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

// The same for the other collectives: repeated broadcasts (in and out of place),
// uneven allgathers, alltoalls with splits and reducescatters, each checked
// element by element with data that changes by step.
TEST(Payload, RepeatedSmallOpsOfEveryKindGoWithTheNegotiation) {
  for (int n : {2, 3, 4}) {  // (4: more ranks than a 2-core machine has cores)
    runRanksOk(n, [&](RankContext& c) {
      const int me = c.rank;
      auto value = [](int rank, int64_t i, DataType dt) { return representable(dt, testValue(rank, i, dt, ReduceOp::kSum)); };
      for (DataType dt : kAllDtypes) {
        const std::string tag = dtypeName(dt);
        const auto before = c.rt.stats();
        for (int step = 0; step < 4; ++step) {
          // Broadcast from the last rank, 37 elements.
          const int root = n - 1;
          HostBuffer b(dt, {37}), bout(dt, {37});
          for (int64_t i = 0; i < 37; ++i) b.set(i, value(me, i + step, dt));
          OpOptions bo;
          bo.name = "pb." + tag;
          const bool inPlace = step % 2 == 0;
          c.rt.submitAndWait([&] { return c.rt.broadcastAsync(b.tensor(), inPlace ? b.tensor() : bout.tensor(), root, bo); });
          for (int64_t i = 0; i < 37; ++i) ASSERT_EQ((inPlace ? b : bout).get(i), value(root, i + step, dt)) << tag << " i " << i;
          // Allgather: rank r sends r + 1 rows of 3.
          HostBuffer g(dt, {me + 1, 3});
          for (int64_t i = 0; i < g.numel(); ++i) g.set(i, value(me, i + step, dt));
          OpOptions go;
          go.name = "pg." + tag;
          Work gw = c.rt.allgather(g.tensor(), go);
          int64_t at = 0;
          for (int r = 0; r < n; ++r)
            for (int64_t i = 0; i < (r + 1) * 3; ++i, ++at)
              ASSERT_EQ(readAs(gw.output().data, dt, at), value(r, i + step, dt)) << tag << " from " << r;
          // Alltoall: rank r sends (r + j) % 2 + 1 rows of 2 to rank j.
          std::vector<int64_t> splits(n);
          int64_t rows = 0;
          for (int j = 0; j < n; ++j) rows += splits[j] = (me + j) % 2 + 1;
          HostBuffer a(dt, {rows, 2});
          for (int64_t i = 0; i < a.numel(); ++i) a.set(i, value(me, i + step, dt));
          OpOptions ao;
          ao.name = "pa." + tag;
          Work aw = c.rt.alltoall(a.tensor(), splits, ao);
          at = 0;
          for (int j = 0; j < n; ++j) {
            int64_t from = 0;  // where j's rows for me start in j's input
            for (int k = 0; k < me; ++k) from += (j + k) % 2 + 1;
            for (int64_t i = 0; i < ((j + me) % 2 + 1) * 2; ++i, ++at)
              ASSERT_EQ(readAs(aw.output().data, dt, at), value(j, from * 2 + i + step, dt)) << tag << " from " << j;
          }
          ASSERT_EQ(aw.receivedSplits()[0], (me % 2) + 1);
          // Reducescatter of 2n + 1 rows of 2 (numeric dtypes).
          if (dt == DataType::kBool) continue;
          const int64_t rsRows = 2 * n + 1;
          HostBuffer in(dt, {rsRows, 2});
          for (int64_t i = 0; i < in.numel(); ++i) in.set(i, testValue(me, i + step, dt, ReduceOp::kSum));
          ReducescatterOptions ro;
          ro.name = "pr." + tag;
          ro.op = ReduceOp::kSum;
          Work rw = c.rt.reducescatter(in.tensor(), ro);
          const int64_t myRows = rsRows / n + (me < rsRows % n ? 1 : 0);
          int64_t start = 0;
          for (int r = 0; r < me; ++r) start += rsRows / n + (r < rsRows % n ? 1 : 0);
          for (int64_t i = 0; i < myRows * 2; ++i) {
            const double want = reference(ReduceOp::kSum, dt, n, start * 2 + i + step);
            ASSERT_NEAR(readAs(rw.output().data, dt, i), want, tolerance(dt, want)) << tag << " i " << i;
          }
        }
        // The first use of each is negotiated; its three repeats go with their negotiation.
        const int kinds = dt == DataType::kBool ? 3 : 4;
        EXPECT_EQ(c.rt.stats().payloadOps - before.payloadOps, 3 * kinds) << tag;
      }
    }, shm);
  }
}

// Transports that carry no payload take every op the usual way, empty ones and
// a broadcast's non-roots (which would send nothing) included.
TEST(Payload, TransportsWithoutPayloadsRunRepeatedEmptyOpsTheUsualWay) {
  runRanksOk(2, [&](RankContext& c) {
    for (int step = 0; step < 3; ++step) {
      HostBuffer e(DataType::kFloat32, {0});
      c.rt.allreduce(e.tensor(), e.tensor(), named("empty"));
      HostBuffer b(DataType::kInt32, {3});
      for (int i = 0; i < 3; ++i) b.set(i, c.rank == 0 ? 10 * step + i : -1);
      OpOptions bo;
      bo.name = "bcast";
      c.rt.broadcast(b.tensor(), 0, bo);
      for (int i = 0; i < 3; ++i) ASSERT_EQ(b.get(i), 10 * step + i);
      HostBuffer g(DataType::kInt32, {c.rank == 1 ? 2 : 0});
      for (int i = 0; i < g.numel(); ++i) g.set(i, step + i);
      OpOptions go;
      go.name = "gather";
      Work w = c.rt.allgather(g.tensor(), go);
      ASSERT_EQ(w.output().shape, Shape{2});
      for (int i = 0; i < 2; ++i) ASSERT_EQ(readAs(w.output().data, DataType::kInt32, i), step + i);
    }
    EXPECT_EQ(c.rt.stats().payloadOps, 0);
  }, [](Config& cfg) { cfg.cpuOperations = "tcp"; });
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

// Average's division happens as the elements are reduced, by the one rank that
// reduces each: the results are the same bits everywhere, small (with the
// negotiation) and large (through the slots), float32 and bfloat16.
TEST(Payload, AveragesAreTheSameBitsEverywhere) {
  const int n = 3;
  const std::vector<int64_t> counts = {257, 300007};
  std::vector<std::vector<std::vector<char>>> results(n);
  runRanksOk(n, [&](RankContext& c) {
    for (DataType dt : {DataType::kFloat32, DataType::kBFloat16}) {
      for (int64_t count : counts) {
        HostBuffer v(dt, {count});
        const double scale = c.rank == 0 ? 1e4 : c.rank == 1 ? 1.37 : -3e3;  // rounding depends on the order
        for (int64_t i = 0; i < count; ++i) v.set(i, scale * (0.1 + (i % 977) * 1e-3));
        AllreduceOptions o;
        o.op = ReduceOp::kAverage;
        o.name = std::string("avg.") + dtypeName(dt) + std::to_string(count);
        c.rt.allreduce(v.tensor(), v.tensor(), o);
        for (int64_t i = 0; i < count; ++i) {
          const double want = (1e4 + 1.37 - 3e3) * (0.1 + (i % 977) * 1e-3) / n;
          ASSERT_NEAR(v.get(i), want, 4 * tolerance(dt, 1e4)) << dtypeName(dt) << " element " << i;
        }
        const char* p = static_cast<const char*>(v.tensor().data);
        results[c.rank].emplace_back(p, p + count * dtypeSize(dt));
      }
    }
  }, shm);
  for (int r = 1; r < n; ++r)
    for (size_t k = 0; k < results[0].size(); ++k)
      ASSERT_EQ(results[r][k], results[0][k]) << "rank " << r << " op " << k;
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
