// Negotiation as Horovod does it: any submission order, the response cache,
// fusion, priorities, and errors that name the tensor and the ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "harness.h"

namespace chorus::testing {
namespace {

AllreduceOptions sumNamed(const std::string& name) {
  AllreduceOptions o;
  o.op = ReduceOp::kSum;
  o.name = name;
  return o;
}

TEST(Negotiation, RanksMaySubmitInDifferentOrders) {
  const int n = 3;
  runRanksOk(n, [&](RankContext& c) {
    const int k = 24;
    std::vector<int> order(k);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(c.rank * 7919 + 1));
    std::vector<HostBuffer> bufs(k, HostBuffer(DataType::kFloat32, {5}));
    std::vector<Work> works;
    for (int t : order) {
      for (int i = 0; i < 5; ++i) bufs[t].set(i, c.rank * 100 + t + i);
      works.push_back(c.rt.allreduceAsync(bufs[t].tensor(), bufs[t].tensor(), sumNamed("t" + std::to_string(t))));
    }
    for (auto& w : works) w.wait();
    for (int t = 0; t < k; ++t)
      for (int i = 0; i < 5; ++i) ASSERT_EQ(bufs[t].get(i), 300 + 3 * (t + i)) << t;
  });
}

TEST(Negotiation, RepeatedStepsAreServedFromTheCache) {
  runRanksOk(2, [&](RankContext& c) {
    const int k = 150;  // cache positions over several 64-bit words
    auto step = [&] {
      std::vector<HostBuffer> bufs(k, HostBuffer(DataType::kFloat32, {3}));
      std::vector<Work> works;
      for (int t = 0; t < k; ++t) {
        bufs[t].set(0, c.rank + t);
        works.push_back(c.rt.allreduceAsync(bufs[t].tensor(), bufs[t].tensor(), sumNamed("g" + std::to_string(t))));
      }
      for (auto& w : works) w.wait();
      for (int t = 0; t < k; ++t) ASSERT_EQ(bufs[t].get(0), 1 + 2 * t);
    };
    step();
    auto before = c.rt.stats();
    for (int s = 0; s < 20; ++s) step();
    auto after = c.rt.stats();
    EXPECT_EQ(after.negotiatedOps, before.negotiatedOps) << "repeated steps went to the coordinator";
    EXPECT_EQ(after.cachedOps - before.cachedOps, 20 * k);
  });
}

TEST(Negotiation, CacheEntryIsReplacedWhenParametersChange) {
  runRanksOk(3, [&](RankContext& c) {
    for (int64_t len : {4, 4, 9, 9, 2}) {
      HostBuffer b(DataType::kFloat64, {len});
      for (int64_t i = 0; i < len; ++i) b.set(i, c.rank + i);
      c.rt.allreduce(b.tensor(), b.tensor(), sumNamed("same.name"));
      for (int64_t i = 0; i < len; ++i) ASSERT_EQ(b.get(i), 3 + 3 * i) << "len " << len;
    }
  });
}

TEST(Negotiation, CacheDisabledStillWorks) {
  runRanksOk(2, [&](RankContext& c) {
    for (int s = 0; s < 5; ++s) {
      HostBuffer b(DataType::kInt32, {2});
      b.set(0, c.rank + s);
      c.rt.allreduce(b.tensor(), b.tensor(), sumNamed("x"));
      ASSERT_EQ(b.get(0), 1 + 2 * s);
    }
    EXPECT_EQ(c.rt.stats().cachedOps, 0);
  }, [](Config& cfg) { cfg.cacheCapacity = 0; });
}

TEST(Negotiation, CacheEvictsLeastRecentlyUsed) {
  runRanksOk(2, [&](RankContext& c) {
    // Capacity 3, ten names in rotation: every step evicts, results stay right.
    for (int s = 0; s < 3; ++s) {
      for (int t = 0; t < 10; ++t) {
        HostBuffer b(DataType::kFloat32, {1});
        b.set(0, t + c.rank);
        c.rt.allreduce(b.tensor(), b.tensor(), sumNamed("r" + std::to_string(t)));
        ASSERT_EQ(b.get(0), 2 * t + 1);
      }
    }
  }, [](Config& cfg) { cfg.cacheCapacity = 3; });
}

int64_t batchesForGroup(int64_t threshold) {
  std::atomic<int64_t> batches{-1};
  runRanksOk(2, [&](RankContext& c) {
    std::vector<HostBuffer> bufs(10, HostBuffer(DataType::kFloat32, {16}));
    std::vector<Tensor> ts;
    for (int t = 0; t < 10; ++t) {
      for (int i = 0; i < 16; ++i) bufs[t].set(i, t + i + c.rank);
      ts.push_back(bufs[t].tensor());
    }
    auto before = c.rt.stats();
    c.rt.groupedAllreduceAsync(ts, ts, sumNamed("grp")).wait();
    for (int t = 0; t < 10; ++t)
      for (int i = 0; i < 16; ++i) ASSERT_EQ(bufs[t].get(i), 2 * (t + i) + 1);
    if (c.rank == 0) batches = c.rt.stats().allreduceBatches - before.allreduceBatches;
  }, [&](Config& cfg) { cfg.fusionThresholdBytes = threshold; });
  return batches;
}

TEST(Negotiation, FusionPacksReadyTensorsUpToTheThreshold) {
  EXPECT_EQ(batchesForGroup(128 << 20), 1);
  EXPECT_EQ(batchesForGroup(0), 10) << "a zero threshold disables fusion";
  EXPECT_EQ(batchesForGroup(2 * 64), 5) << "64-byte tensors, 128-byte buffer: two per batch";
}

TEST(Negotiation, HigherPriorityRunsFirstAmongReadyOps) {
  runRanksOk(2, [&](RankContext& c) {
    std::mutex mu;
    std::vector<std::string> order;
    std::vector<std::vector<char>> storage(8, std::vector<char>(64));
    auto recorder = [&](const std::string& name) {
      return [&, name](const Shape& shape, DataType dt) -> void* {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(name);
        return storage[order.size()].data();
      };
    };
    HostBuffer gate(DataType::kFloat32, {1});
    std::vector<HostBuffer> in(3, HostBuffer(DataType::kFloat32, {1}));
    const std::vector<std::pair<std::string, int>> ops = {{"low", 0}, {"high", 10}, {"mid", 5}};
    std::promise<void> allQueued, gateEntered;
    auto queued = allQueued.get_future().share();
    auto entered = gateEntered.get_future();
    Allocator gateAlloc = nullptr;
    if (c.rank == 1) {
      // Rank 1's controller holds on inside the gate op (so this cycle's queue is
      // already drained) until all three ops are queued: they then become ready
      // everywhere in one later cycle.
      gateAlloc = [queued, &storage, &gateEntered](const Shape&, DataType) -> void* {
        gateEntered.set_value();
        queued.wait();
        return storage[0].data();
      };
    }
    OpOptions g;
    g.name = "gate";
    Work gw = c.rt.allgatherAsync(gate.tensor(), g, gateAlloc);
    if (c.rank == 1) entered.wait();
    std::vector<Work> works;
    for (size_t k = 0; k < ops.size(); ++k) {
      OpOptions o;
      o.name = ops[k].first;
      o.priority = ops[k].second;
      works.push_back(c.rt.allgatherAsync(in[k].tensor(), o, recorder(ops[k].first)));
    }
    allQueued.set_value();
    gw.wait();
    for (auto& w : works) w.wait();
    EXPECT_EQ(order, (std::vector<std::string>{"high", "mid", "low"}));
  });
}

TEST(Negotiation, MismatchIsAnErrorOnEveryRankAndTheRuntimeGoesOn) {
  const int n = 3;
  auto errors = runRanks(n, [&](RankContext& c) {
    // rank 1 sends float64 where the others send float32
    DataType dt = c.rank == 1 ? DataType::kFloat64 : DataType::kFloat32;
    HostBuffer b(dt, {4});
    try {
      c.rt.allreduce(b.tensor(), b.tensor(), sumNamed("grad.w"));
      ADD_FAILURE() << "rank " << c.rank << ": no mismatch error";
    } catch (const Mismatch& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("grad.w"), std::string::npos) << msg;
      EXPECT_NE(msg.find("float64 on ranks [1]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("float32 on ranks [0, 2]"), std::string::npos) << msg;
    }
    // shape mismatch, then broadcast root mismatch
    HostBuffer s(DataType::kFloat32, {c.rank == 2 ? 5 : 4});
    EXPECT_THROW(c.rt.allreduce(s.tensor(), s.tensor(), sumNamed("shape.t")), Mismatch);
    HostBuffer r(DataType::kFloat32, {2});
    OpOptions bo;
    bo.name = "root.t";
    try {
      c.rt.broadcast(r.tensor(), c.rank == 0 ? 0 : 1, bo);
      ADD_FAILURE() << "no root mismatch";
    } catch (const Mismatch& e) {
      EXPECT_NE(std::string(e.what()).find("root rank"), std::string::npos) << e.what();
    }
    AllreduceOptions oo = sumNamed("op.t");
    oo.op = c.rank == 0 ? ReduceOp::kMax : ReduceOp::kSum;
    EXPECT_THROW(c.rt.allreduce(r.tensor(), r.tensor(), oo), Mismatch);
    // The runtime keeps serving.
    HostBuffer ok(DataType::kFloat32, {4});
    for (int i = 0; i < 4; ++i) ok.set(i, 1);
    c.rt.allreduce(ok.tensor(), ok.tensor(), sumNamed("grad.w"));
    EXPECT_EQ(ok.get(0), n);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << r;
}

TEST(Negotiation, DuplicateNameInFlightIsRefused) {
  // Rank 1 submits only after rank 0's second try, so rank 0's first is still in flight.
  std::atomic<bool> tried{false};
  runRanksOk(2, [&](RankContext& c) {
    HostBuffer a(DataType::kFloat32, {2}), b(DataType::kFloat32, {2});
    if (c.rank == 1)
      while (!tried) std::this_thread::yield();
    Work w = c.rt.allreduceAsync(a.tensor(), a.tensor(), sumNamed("dup"));
    if (c.rank == 0) {
      try {
        c.rt.allreduceAsync(b.tensor(), b.tensor(), sumNamed("dup"));
        ADD_FAILURE() << "duplicate accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("'dup' is already in flight"), std::string::npos) << e.what();
      }
      tried = true;
    }
    w.wait();
  });
}

TEST(Negotiation, RefusedGroupReleasesTheNamesItClaimed) {
  // "g.1" in flight on its own: a group named "g" (g.0, g.1, g.2) is refused as a
  // whole, and g.0 is free again afterwards, so the group goes through later.
  std::atomic<bool> tried{false};
  runRanksOk(2, [&](RankContext& c) {
    HostBuffer lone(DataType::kFloat32, {2});
    std::vector<HostBuffer> bufs;
    for (int i = 0; i < 3; ++i) bufs.emplace_back(DataType::kFloat32, Shape{3});
    std::vector<Tensor> ts;
    for (auto& b : bufs) ts.push_back(b.tensor());
    if (c.rank == 1)
      while (!tried) std::this_thread::yield();
    Work w = c.rt.allreduceAsync(lone.tensor(), lone.tensor(), sumNamed("g.1"));
    if (c.rank == 0) {
      EXPECT_THROW(c.rt.groupedAllreduceAsync(ts, ts, sumNamed("g")), InvalidArgument);
      tried = true;
    }
    w.wait();
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 3; ++k) bufs[i].set(k, static_cast<float>(c.rank + i + k));
    c.rt.groupedAllreduceAsync(ts, ts, sumNamed("g")).wait();
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 3; ++k) EXPECT_EQ(bufs[i].get(k), static_cast<float>(1 + 2 * (i + k)));
  });
}

TEST(Negotiation, BadArgumentsFailImmediately) {
  runRanksOk(2, [&](RankContext& c) {
    HostBuffer a(DataType::kFloat32, {6}), b(DataType::kFloat32, {5});
    EXPECT_THROW(c.rt.allreduceAsync(a.tensor(), b.tensor()), InvalidArgument);
    EXPECT_THROW(c.rt.alltoallAsync(b.tensor(), {}), InvalidArgument);  // 5 rows, 2 ranks
    EXPECT_THROW(c.rt.alltoallAsync(a.tensor(), {1, 2}), InvalidArgument);
    EXPECT_THROW(c.rt.broadcastAsync(a.tensor(), a.tensor(), 7), InvalidArgument);
    ReducescatterOptions ro;
    ro.op = ReduceOp::kMax;
    EXPECT_THROW(c.rt.reducescatterAsync(a.tensor(), ro), InvalidArgument);
    EXPECT_THROW(c.rt.allreduceAsync(Tensor{nullptr, DataType::kFloat32, {3}}, Tensor{nullptr, DataType::kFloat32, {3}}),
                 InvalidArgument);
  });
}

// The message names the op, the tensor and what is wrong with it.
TEST(Negotiation, BadArgumentErrorsNameTheOpAndTheTensor) {
  runRanksOk(1, [&](RankContext& c) {
    auto message = [](const std::function<void()>& f) -> std::string {
      try {
        f();
      } catch (const InvalidArgument& e) {
        return e.what();
      }
      return "(no error)";
    };
    auto has = [](const std::string& text, const std::string& part) {
      return text.find(part) != std::string::npos;
    };
    HostBuffer a(DataType::kFloat32, {6}), b(DataType::kFloat32, {5});
    AllreduceOptions ao;
    ao.name = "w.grad";
    std::string m = message([&] { c.rt.allreduceAsync(a.tensor(), b.tensor(), ao); });
    EXPECT_TRUE(has(m, "allreduce 'w.grad': output (float32 [5]) must match input (float32 [6])")) << m;
    ao.name = "grp";
    m = message([&] {
      c.rt.groupedAllreduceAsync({a.tensor(), Tensor{nullptr, DataType::kFloat32, {3}}},
                                 {a.tensor(), Tensor{nullptr, DataType::kFloat32, {3}}}, ao);
    });
    EXPECT_TRUE(has(m, "allreduce 'grp.1' input: data pointer is null")) << m;
    OpOptions o;
    o.name = "b";
    Tensor negative{a.tensor().data, DataType::kFloat32, {-2}};
    m = message([&] { c.rt.broadcastAsync(negative, negative, 0, o); });
    EXPECT_TRUE(has(m, "broadcast 'b' input: negative dimension")) << m;
  });
}

TEST(Negotiation, SynchronizeWaitsForEverythingInFlight) {
  runRanksOk(2, [&](RankContext& c) {
    std::vector<HostBuffer> bufs(8, HostBuffer(DataType::kFloat32, {100}));
    std::vector<Work> works;
    for (int t = 0; t < 8; ++t) {
      for (int i = 0; i < 100; ++i) bufs[t].set(i, 1);
      works.push_back(c.rt.allreduceAsync(bufs[t].tensor(), bufs[t].tensor(), sumNamed("s" + std::to_string(t))));
    }
    c.rt.synchronize();
    for (auto& w : works) EXPECT_TRUE(w.poll());
    for (int t = 0; t < 8; ++t) EXPECT_EQ(bufs[t].get(99), 2);
  });
}

TEST(Negotiation, ShutdownAndInitAgainAfterAnError) {
  auto store = makeMemoryStore();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        Runtime rt;
        for (int round = 0; round < 3; ++round) {
          Config cfg;
          cfg.rank = r;
          cfg.size = 2;
          cfg.store = store;
          rt.init(cfg);
          HostBuffer bad(r == 0 ? DataType::kInt32 : DataType::kInt64, {1});
          EXPECT_THROW(rt.allreduce(bad.tensor(), bad.tensor(), sumNamed("bad")), Mismatch);
          HostBuffer good(DataType::kInt32, {1});
          good.set(0, 5);
          rt.allreduce(good.tensor(), good.tensor(), sumNamed("good"));
          EXPECT_EQ(good.get(0), 10);
          rt.shutdown();
          EXPECT_FALSE(rt.isInitialized());
          EXPECT_THROW(rt.allreduce(good.tensor(), good.tensor()), InvalidArgument);
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(Negotiation, StallShutdownFailsStalledOpsOnEveryRank) {
  auto errors = runRanks(2, [&](RankContext& c) {
    if (c.rank == 0) {
      HostBuffer a(DataType::kFloat32, {2});
      try {
        c.rt.allreduce(a.tensor(), a.tensor(), sumNamed("never.matched"));
        ADD_FAILURE() << "stalled op completed";
      } catch (const StallError& e) {
        EXPECT_NE(std::string(e.what()).find("'never.matched' missing ranks [1]"), std::string::npos) << e.what();
      }
    } else {
      // Rank 1 never submits; its later ops fail with the same stall error.
      std::this_thread::sleep_for(std::chrono::milliseconds(3500));
      HostBuffer a(DataType::kFloat32, {2});
      EXPECT_THROW(c.rt.allreduce(a.tensor(), a.tensor(), sumNamed("later")), StallError);
    }
  }, [](Config& cfg) {
    cfg.stallCheckSeconds = 1;
    cfg.stallShutdownSeconds = 2;
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace chorus::testing
