// Process sets: static, dynamic, their errors, and independent progress.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "harness.h"

namespace chorus::testing {
namespace {

AllreduceOptions sumOn(int32_t set, const std::string& name) {
  AllreduceOptions o;
  o.op = ReduceOp::kSum;
  o.processSet = set;
  o.name = name;
  return o;
}

TEST(ProcessSets, StaticSetsFromInit) {
  runRanksOk(4, [&](RankContext& c) {
    auto sets = c.rt.processSets();
    ASSERT_EQ(sets.size(), 3u);
    ProcessSet even = c.rt.processSet(1), odd = c.rt.processSet(2);
    EXPECT_EQ(even.ranks(), (std::vector<int>{0, 2}));
    EXPECT_EQ(even.included(), c.rank % 2 == 0);
    EXPECT_EQ(odd.included(), c.rank % 2 == 1);
    ProcessSet mine = c.rank % 2 == 0 ? even : odd;
    EXPECT_EQ(mine.rank(), c.rank / 2);
    EXPECT_EQ(mine.size(), 2);
    HostBuffer b(DataType::kInt64, {3});
    for (int i = 0; i < 3; ++i) b.set(i, c.rank);
    c.rt.allreduce(b.tensor(), b.tensor(), sumOn(mine.id(), "x"));
    EXPECT_EQ(b.get(0), c.rank % 2 == 0 ? 0 + 2 : 1 + 3);
    // Broadcast root is a global rank, as in Horovod.
    HostBuffer r(DataType::kFloat32, {2});
    r.set(0, c.rank);
    OpOptions bo;
    bo.processSet = mine.id();
    c.rt.broadcast(r.tensor(), c.rank % 2 == 0 ? 2 : 3, bo);
    EXPECT_EQ(r.get(0), c.rank % 2 == 0 ? 2 : 3);
    // Not a member: an immediate, clear error.
    ProcessSet other = c.rank % 2 == 0 ? odd : even;
    try {
      c.rt.allreduce(b.tensor(), b.tensor(), sumOn(other.id(), "y"));
      ADD_FAILURE() << "collective on a foreign set accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is not in process set"), std::string::npos) << e.what();
    }
  }, [](Config& cfg) { cfg.processSets = {{0, 2}, {3, 1}}; });
}

TEST(ProcessSets, BadStaticSetsAreRejectedAtInit) {
  for (auto sets : std::vector<std::vector<std::vector<int>>>{{{0, 0}}, {{0, 5}}, {{}}}) {
    auto errors = runRanks(2, [](RankContext&) {}, [&](Config& cfg) { cfg.processSets = sets; });
    for (const auto& e : errors) EXPECT_NE(e.find("process set"), std::string::npos) << e;
  }
}

TEST(ProcessSets, StaticSetsThatDifferBetweenRanksAreRejected) {
  auto errors = runRanks(2, [](RankContext&) {}, [](Config& cfg) {
    cfg.processSets = {{0, 1}};
    if (cfg.rank == 1) cfg.processSets = {{1}};
  });
  for (const auto& e : errors) EXPECT_NE(e.find("differ between ranks"), std::string::npos) << e;
}

TEST(ProcessSets, DynamicAddAndRemove) {
  runRanksOk(3, [&](RankContext& c) {
    ProcessSet ps = c.rt.addProcessSet({2, 0});
    EXPECT_EQ(ps.ranks(), (std::vector<int>{0, 2}));
    EXPECT_EQ(ps.included(), c.rank != 1);
    if (ps.included()) {
      HostBuffer b(DataType::kFloat32, {1});
      b.set(0, c.rank + 1);
      c.rt.allreduce(b.tensor(), b.tensor(), sumOn(ps.id(), "d"));
      EXPECT_EQ(b.get(0), 4);
    }
    ProcessSet ps2 = c.rt.addProcessSet({1, 2});
    EXPECT_NE(ps2.id(), ps.id());
    c.rt.removeProcessSet(ps.id());
    HostBuffer b(DataType::kFloat32, {1});
    EXPECT_THROW(c.rt.allreduce(b.tensor(), b.tensor(), sumOn(ps.id(), "gone")), InvalidArgument);
    EXPECT_THROW(c.rt.removeProcessSet(kGlobalProcessSetId), InvalidArgument);
    EXPECT_THROW(c.rt.addProcessSet({0, 3}), InvalidArgument);  // out of range
    EXPECT_THROW(c.rt.addProcessSet({1, 1}), InvalidArgument);  // duplicate
    if (ps2.included()) {
      b.set(0, 1);
      c.rt.allreduce(b.tensor(), b.tensor(), sumOn(ps2.id(), "d2"));
      EXPECT_EQ(b.get(0), 2);
    }
    c.rt.barrier();
  }, [](Config& cfg) { cfg.dynamicProcessSets = true; });
}

TEST(ProcessSets, AddingDifferentSetsOnDifferentRanksIsAnErrorEverywhere) {
  auto errors = runRanks(3, [&](RankContext& c) {
    std::vector<int> ranks = c.rank == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1};
    try {
      c.rt.addProcessSet(ranks);
      ADD_FAILURE() << "rank " << c.rank << " accepted inconsistent sets";
    } catch (const InvalidArgument& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("add [0, 1] on ranks [0, 1]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("add [0, 2] on ranks [2]"), std::string::npos) << msg;
    }
    // Still usable afterwards.
    HostBuffer b(DataType::kInt32, {1});
    b.set(0, 1);
    c.rt.allreduce(b.tensor(), b.tensor(), sumOn(0, "after"));
    EXPECT_EQ(b.get(0), 3);
  }, [](Config& cfg) { cfg.dynamicProcessSets = true; });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ProcessSets, AddWithoutDynamicModeIsRefused) {
  runRanksOk(2, [&](RankContext& c) {
    try {
      c.rt.addProcessSet({0});
      ADD_FAILURE();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("dynamic"), std::string::npos);
    }
  });
}

// Horovod serves sets one after another; here a set waiting on a slow rank must
// not hold up another set.
TEST(ProcessSets, SetsProgressIndependently) {
  std::atomic<bool> otherSetDone{false};
  std::atomic<bool> pendingWhileOtherRan{false};
  runRanksOk(3, [&](RankContext& c) {
    const int32_t a = 1, b = 2;  // a = {0, 1}, b = {1, 2}
    if (c.rank == 1) {
      HostBuffer x(DataType::kFloat32, {4});
      Work wa = c.rt.allreduceAsync(x.tensor(), x.tensor(), sumOn(a, "waits.for.rank0"));
      for (int s = 0; s < 20; ++s) {
        HostBuffer y(DataType::kFloat32, {4});
        y.set(0, 1);
        c.rt.allreduce(y.tensor(), y.tensor(), sumOn(b, "b" + std::to_string(s)));
        ASSERT_EQ(y.get(0), 2);
      }
      pendingWhileOtherRan = !wa.poll();
      otherSetDone = true;
      wa.wait();
    } else if (c.rank == 2) {
      for (int s = 0; s < 20; ++s) {
        HostBuffer y(DataType::kFloat32, {4});
        y.set(0, 1);
        c.rt.allreduce(y.tensor(), y.tensor(), sumOn(b, "b" + std::to_string(s)));
      }
    } else {
      // Rank 0 is "slow": it submits only after set b finished (or gives up waiting).
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      while (!otherSetDone && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      HostBuffer x(DataType::kFloat32, {4});
      c.rt.allreduce(x.tensor(), x.tensor(), sumOn(a, "waits.for.rank0"));
    }
  }, [](Config& cfg) { cfg.processSets = {{0, 1}, {1, 2}}; });
  EXPECT_TRUE(otherSetDone.load());
  EXPECT_TRUE(pendingWhileOtherRan.load());
}

// Rank 1 uses a name on set {0, 1} while ranks 0 and 2 use it on the global set:
// an error naming the tensor and the sets on every rank, and both sets go on serving.
TEST(ProcessSets, SameNameOnDifferentSetsIsAnErrorEverywhere) {
  runRanksOk(3, [&](RankContext& c) {
    const int32_t pair = 1;
    HostBuffer x(DataType::kFloat32, {8});
    const int32_t set = c.rank == 1 ? pair : kGlobalProcessSetId;
    try {
      c.rt.allreduce(x.tensor(), x.tensor(), sumOn(set, "grad.w"));
      FAIL() << "rank " << c.rank << ": the conflicting allreduce completed";
    } catch (const Mismatch& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'grad.w'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("process set 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("process set 0"), std::string::npos) << msg;
    }
    // Both sets still work, and the name is free again.
    HostBuffer y(DataType::kFloat32, {2});
    y.set(0, 1);
    c.rt.allreduce(y.tensor(), y.tensor(), sumOn(kGlobalProcessSetId, "grad.w"));
    EXPECT_EQ(y.get(0), 3);
    if (c.rank < 2) {
      HostBuffer z(DataType::kFloat32, {2});
      z.set(0, 1);
      c.rt.allreduce(z.tensor(), z.tensor(), sumOn(pair, "after"));
      EXPECT_EQ(z.get(0), 2);
    }
  }, [](Config& cfg) { cfg.processSets = {{0, 1}}; });
}

TEST(ProcessSets, ANameIsInFlightOnOneSetAtATime) {
  // Rank 1 submits only after rank 0's try, so rank 0's first use is still in flight.
  std::atomic<bool> tried{false};
  runRanksOk(2, [&](RankContext& c) {
    HostBuffer x(DataType::kFloat32, {4}), y(DataType::kFloat32, {4});
    if (c.rank == 1)
      while (!tried) std::this_thread::yield();
    Work w = c.rt.allreduceAsync(x.tensor(), x.tensor(), sumOn(kGlobalProcessSetId, "once"));
    if (c.rank == 0) {
      try {
        c.rt.allreduceAsync(y.tensor(), y.tensor(), sumOn(1, "once"));
        ADD_FAILURE() << "a name in flight on another set was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("in flight on process set 0"), std::string::npos) << e.what();
      }
      tried = true;
    }
    w.wait();
    c.rt.allreduce(y.tensor(), y.tensor(), sumOn(1, "once"));  // free once the first completed
  }, [](Config& cfg) { cfg.processSets = {{0, 1}}; });
}

}  // namespace
}  // namespace chorus::testing
