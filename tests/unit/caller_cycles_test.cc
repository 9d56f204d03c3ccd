// Waiting callers run their set's cycles themselves (CycleDriver): synchronous
// calls on the calling thread, async ops that nobody waits for on the
// controller thread, and many waiting threads on one set at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "harness.h"

namespace chorus::testing {
namespace {

class CallerCycles : public ::testing::TestWithParam<std::string> {
 protected:
  ConfigTweak transport() const {
    return [t = GetParam()](Config& c) { c.cpuOperations = t; };
  }
};

// Records the thread that allocates an allgather's output: the thread that ran the op.
struct Recorder {
  std::thread::id who;
  std::vector<float> storage;
  Allocator alloc() {
    return [this](const Shape& shape, DataType) -> void* {
      who = std::this_thread::get_id();
      storage.assign(numElements(shape), 0);
      return storage.data();
    };
  }
};

TEST_P(CallerCycles, SynchronousCallsRunOnTheCallingThreadAndPolledOpsOnTheController) {
  runRanksOk(2, [&](RankContext& c) {
    for (int round = 0; round < 2; ++round) {
      // One rank waits at once, the other only polls: each runs where it must.
      const bool sync = c.rank == round;
      float mine[2] = {static_cast<float>(c.rank), static_cast<float>(10 + round)};
      OpOptions o;
      o.name = "gather.round" + std::to_string(round);
      Recorder rec;
      Work w = sync ? c.rt.allgather(Tensor{mine, DataType::kFloat32, {1, 2}}, o, rec.alloc())
                    : c.rt.allgatherAsync(Tensor{mine, DataType::kFloat32, {1, 2}}, o, rec.alloc());
      while (!w.poll()) std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (w.error()) std::rethrow_exception(w.error());
      if (sync) {
        EXPECT_EQ(rec.who, std::this_thread::get_id()) << "rank " << c.rank << " round " << round;
      } else {
        EXPECT_NE(rec.who, std::this_thread::get_id()) << "rank " << c.rank << " round " << round;
      }
      ASSERT_EQ(rec.storage.size(), 4u);
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(rec.storage[2 * r], r);
        EXPECT_EQ(rec.storage[2 * r + 1], 10 + round);
      }
    }
  }, [&](Config& c) {
    transport()(c);
    c.cycleTimeMs = 50;  // timer cycles of the controller threads stay rare
  });
}

TEST_P(CallerCycles, ManyWaitingThreadsShareOneSet) {
  const int n = 3, threads = 3, ops = 25;
  runRanksOk(n, [&](RankContext& c) {
    std::vector<std::string> errors(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          for (int i = 0; i < ops; ++i) {
            double v[3] = {1.0 * c.rank, 1.0 * t, 1.0 * i};
            AllreduceOptions o;
            o.op = ReduceOp::kSum;
            o.name = "thread" + std::to_string(t) + ".op" + std::to_string(i);
            c.rt.allreduce(Tensor{v, DataType::kFloat64, {3}}, Tensor{v, DataType::kFloat64, {3}}, o);
            // Sum over ranks of (rank, t, i).
            if (v[0] != n * (n - 1) / 2 || v[1] != n * t || v[2] != n * i) {
              errors[t] = o.name + " gave " + std::to_string(v[0]) + "," + std::to_string(v[1]) + "," +
                          std::to_string(v[2]);
              return;
            }
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    // Meanwhile this thread's async ops, completed by whoever runs the cycles.
    std::vector<std::vector<int64_t>> bufs(ops, std::vector<int64_t>(4));
    std::vector<Work> works;
    for (int i = 0; i < ops; ++i) {
      for (int k = 0; k < 4; ++k) bufs[i][k] = c.rank * k + i;
      AllreduceOptions o;
      o.op = ReduceOp::kSum;
      o.name = "main.op" + std::to_string(i);
      Tensor t{bufs[i].data(), DataType::kInt64, {4}};
      works.push_back(c.rt.allreduceAsync(t, t, o));
    }
    c.rt.synchronize();
    for (auto& th : pool) th.join();
    for (int t = 0; t < threads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
    for (int i = 0; i < ops; ++i)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(bufs[i][k], k * n * (n - 1) / 2 + n * i);
  }, transport());
}

// A peer shuts down while this rank waits in an op the peer never submits: the
// agreed stop reaches the waiter that is running the cycles, as an error.
TEST_P(CallerCycles, PeerShutdownFailsTheDrivingWaiter) {
  runRanksOk(2, [&](RankContext& c) {
    if (c.rank == 1) return;  // the harness shuts rank 1 down at once
    float a[2] = {1, 2};
    AllreduceOptions o;
    o.name = "never.matched";
    try {
      c.rt.allreduce(Tensor{a, DataType::kFloat32, {2}}, Tensor{a, DataType::kFloat32, {2}}, o);
      ADD_FAILURE() << "an allreduce the peer never submitted completed";
    } catch (const ShutdownError& e) {
      EXPECT_NE(std::string(e.what()).find("shut down"), std::string::npos) << e.what();
    }
  }, transport());
}

// submitAndWait waits only for the op submit() returns; another op it started
// must not keep the set's thread out of the cycles: a polled op still completes.
TEST_P(CallerCycles, SubmitAndWaitReleasesOpsItDoesNotWaitFor) {
  runRanksOk(2, [&](RankContext& c) {
    float a[1] = {1}, b[1] = {2}, d[1] = {3};
    AllreduceOptions o;
    o.op = ReduceOp::kSum;
    std::optional<Work> first;
    c.rt.submitAndWait([&] {
      o.name = "first";
      first.emplace(c.rt.allreduceAsync(Tensor{a, DataType::kFloat32, {1}}, Tensor{a, DataType::kFloat32, {1}}, o));
      o.name = "second";
      return c.rt.allreduceAsync(Tensor{b, DataType::kFloat32, {1}}, Tensor{b, DataType::kFloat32, {1}}, o);
    });
    EXPECT_EQ(b[0], 4);
    o.name = "polled";
    Work w = c.rt.allreduceAsync(Tensor{d, DataType::kFloat32, {1}}, Tensor{d, DataType::kFloat32, {1}}, o);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!w.poll() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    ASSERT_TRUE(w.poll()) << "an op nobody waits for did not complete";
    EXPECT_EQ(d[0], 6);
    first->wait();
    EXPECT_EQ(a[0], 2);
  }, transport());
}

// Kernels that complete by callback (TensorFlow's): whenDone runs once, after the
// outputs are written, on the finishing thread or at once when already done; a
// bounded driveFor runs the cycles on the caller and never waits past its budget
// for a peer that has not submitted.
TEST_P(CallerCycles, WhenDoneAndBoundedDriving) {
  std::atomic<bool> rank0Returned{false};
  runRanksOk(2, [&](RankContext& c) {
    for (int round = 0; round < 3; ++round) {
      float mine[3] = {1.0f + c.rank, 2.0f, 3.0f * c.rank};
      float out[3] = {0, 0, 0};
      AllreduceOptions o;
      o.op = ReduceOp::kSum;
      o.name = "when_done." + std::to_string(round);
      std::atomic<int> calls{0};
      std::atomic<float> seen{0};
      Work w = c.rt.allreduceAsync(Tensor{mine, DataType::kFloat32, {3}}, Tensor{out, DataType::kFloat32, {3}}, o);
      if (round == 1) w.driveFor(std::chrono::microseconds(200000));
      w.whenDone([&] {
        seen = out[0];
        calls++;
      });
      while (calls.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      EXPECT_EQ(calls.load(), 1);
      EXPECT_EQ(seen.load(), 3.0f);  // 1 + 2: written before the callback ran
      bool ranHere = false;
      w.whenDone([&] { ranHere = true; });  // already done: runs now, on this thread
      EXPECT_TRUE(ranHere);
    }
    // Rank 1 submits only once rank 0's driving has given up: were it not
    // bounded, this would never finish.
    float v[1] = {1.0f};
    AllreduceOptions o;
    o.op = ReduceOp::kSum;
    o.name = "late";
    if (c.rank == 1) {
      while (!rank0Returned.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    Work w = c.rt.allreduceAsync(Tensor{v, DataType::kFloat32, {1}}, Tensor{v, DataType::kFloat32, {1}}, o);
    if (c.rank == 0) {
      EXPECT_FALSE(w.driveFor(std::chrono::microseconds(20000)));
      rank0Returned = true;
    }
    w.wait();
    EXPECT_EQ(v[0], 2.0f);
  }, transport());
}

INSTANTIATE_TEST_SUITE_P(Paths, CallerCycles, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace chorus::testing
