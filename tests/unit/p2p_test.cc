// Point-to-point between ranks as threads: every dtype, small (eager) and large
// (announced) messages, on one host (cross-memory attach, or streamed) and
// across two, tag matching, process sets, and the errors on both ends.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "harness.h"

namespace chorus::testing {
namespace {

struct Path {
  const char* name;
  bool twoHosts;
  bool crossMemoryAttach;
};
const Path kPaths[] = {{"one_host_cma", false, true}, {"one_host_streamed", false, false}, {"two_hosts", true, true}};

// A job id of this test process's own: the rings' segments carry it.
std::string jobId() { return "p2ptest" + std::to_string(getpid()); }

ConfigTweak pathTweak(const Path& path, double timeoutSeconds = 20) {
  return [path, timeoutSeconds](Config& c) {
    if (path.twoHosts) c.hostname = c.rank % 2 ? "hostB" : "hostA";
    c.shmSingleCopy = path.crossMemoryAttach;
    c.timeoutSeconds = timeoutSeconds;
    c.jobId = jobId();
  };
}

// Shared-memory segments of this job still named in /dev/shm.
int leftovers() {
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind("chorus-" + jobId() + "-", 0) == 0 ? 1 : 0;
    closedir(d);
  }
  return n;
}

// Rank src's message: values no other rank or element shares (within the dtype's range).
double sent(int src, int64_t i, DataType dtype) { return testValue(src, i, dtype, ReduceOp::kSum); }

class P2pRing : public ::testing::TestWithParam<std::tuple<int, Path>> {};

// Each rank sends to the next and receives from the one before, all posted in
// one batch: every dtype, empty, one element, eager and announced sizes.
TEST_P(P2pRing, EveryDtypeAndSize) {
  const auto [n, path] = GetParam();
  runRanksOk(n, [&](RankContext& ctx) {
    const int next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
    for (DataType dtype : kAllDtypes) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{300001}}) {
        HostBuffer out(dtype, {count}), in(dtype, {count});
        for (int64_t i = 0; i < count; ++i) {
          out.set(i, sent(ctx.rank, i, dtype));
          in.set(i, 0);
        }
        auto works = ctx.rt.batchSendRecvAsync({P2pOp{false, in.tensor(), prev, 7}, P2pOp{true, out.tensor(), next, 7}});
        for (auto& w : works) w.wait();
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(in.get(i), representable(dtype, sent(prev, i, dtype))) << dtypeName(dtype) << " " << count << " @" << i;
      }
    }
  }, pathTweak(path));
  EXPECT_EQ(leftovers(), 0);  // every pair's rings were unnamed once both ranks held them
}

INSTANTIATE_TEST_SUITE_P(Ranks, P2pRing, ::testing::Combine(::testing::Values(2, 3, 4), ::testing::ValuesIn(kPaths)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param).name;
                         });

class P2pPaths : public ::testing::TestWithParam<Path> {};

// A recv takes the first send with its tag, whatever the order of posting: the
// sends are in flight before any recv exists (eager and announced alike), and
// two sends with one tag arrive in the order they were sent.
TEST_P(P2pPaths, TagsMatchInAnyOrder) {
  runRanksOk(2, [&](RankContext& ctx) {
    const int64_t counts[] = {5, 200000, 7, 150000};
    const int32_t tags[] = {1, 2, 3, 3};
    if (ctx.rank == 0) {
      std::vector<std::vector<float>> data;
      std::vector<Work> works;
      for (int k = 0; k < 4; ++k) {
        data.emplace_back(counts[k]);
        for (int64_t i = 0; i < counts[k]; ++i) data[k][i] = static_cast<float>(k * 1000 + i % 977);
      }
      for (int k = 0; k < 4; ++k)
        works.push_back(ctx.rt.sendAsync(makeTensor(data[k].data(), {counts[k]}, DataType::kFloat32), 1, {0, tags[k]}));
      for (auto& w : works) w.wait();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the sends arrive first
      std::vector<std::vector<float>> got(4);
      for (int k = 0; k < 4; ++k) got[k].resize(counts[k]);
      // Tag 3 twice: the first recv gets the first send (7 elements).
      ctx.rt.recv(makeTensor(got[2].data(), {counts[2]}, DataType::kFloat32), 0, {0, 3});
      ctx.rt.recv(makeTensor(got[1].data(), {counts[1]}, DataType::kFloat32), 0, {0, 2});
      ctx.rt.recv(makeTensor(got[3].data(), {counts[3]}, DataType::kFloat32), 0, {0, 3});
      ctx.rt.recv(makeTensor(got[0].data(), {counts[0]}, DataType::kFloat32), 0, {0, 1});
      for (int k = 0; k < 4; ++k)
        for (int64_t i = 0; i < counts[k]; ++i) ASSERT_EQ(got[k][i], static_cast<float>(k * 1000 + i % 977)) << k;
    }
    // Both leave together: this test is about matching. (A receiver that shuts down
    // right after its last recv can still fail the sender's wait for that send's
    // completion: a known shutdown race in SocketP2p, not fixed yet.)
    ctx.rt.barrier();
  }, pathTweak(GetParam()));
}

// Blocking sends both ways at once would wait on each other above the eager
// size; as a batch they cannot.
TEST_P(P2pPaths, BatchOfSendsAndRecvsBothWays) {
  runRanksOk(2, [&](RankContext& ctx) {
    const int peer = 1 - ctx.rank;
    std::vector<double> a(1 << 18, ctx.rank + 0.5), b(1 << 18, -1), c(3, ctx.rank + 10.0), d(3, -1);
    auto works = ctx.rt.batchSendRecvAsync({P2pOp{true, makeTensor(a.data(), {1 << 18}, DataType::kFloat64), peer, 0},
                                            P2pOp{true, makeTensor(c.data(), {3}, DataType::kFloat64), peer, 1},
                                            P2pOp{false, makeTensor(b.data(), {1 << 18}, DataType::kFloat64), peer, 0},
                                            P2pOp{false, makeTensor(d.data(), {3}, DataType::kFloat64), peer, 1}});
    for (auto& w : works) w.wait();
    EXPECT_EQ(b.front(), peer + 0.5);
    EXPECT_EQ(b.back(), peer + 0.5);
    EXPECT_EQ(d[2], peer + 10.0);
  }, pathTweak(GetParam()));
}

// Both ends fail with the same message naming both ranks, eager and announced.
TEST_P(P2pPaths, SizeOrDtypeMismatchFailsBothEnds) {
  for (int64_t count : {int64_t{10}, int64_t{100000}}) {
    for (bool dtypeOnly : {false, true}) {
      auto errors = runRanks(2, [&](RankContext& ctx) {
        std::vector<float> buf(count + 2, 1.0f);
        if (ctx.rank == 0) {
          ctx.rt.send(makeTensor(buf.data(), {count}, DataType::kFloat32), 1, {0, 4});
        } else if (dtypeOnly) {
          ctx.rt.recv(makeTensor(buf.data(), {count}, DataType::kInt32), 0, {0, 4});
        } else {
          ctx.rt.recv(makeTensor(buf.data(), {count + 2}, DataType::kFloat32), 0, {0, 4});
        }
      }, pathTweak(GetParam()));
      for (int r = 0; r < 2; ++r) {
        EXPECT_NE(errors[r].find("point-to-point mismatch: rank 0 sends " + std::to_string(count * 4) +
                                 " bytes (float32) with tag 4"),
                  std::string::npos) << errors[r];
        EXPECT_NE(errors[r].find(dtypeOnly ? "to rank 1, which receives " + std::to_string(count * 4) + " bytes (int32)"
                                           : "to rank 1, which receives " + std::to_string(count * 4 + 8) + " bytes (float32)"),
                  std::string::npos) << errors[r];
      }
    }
  }
}

// A send nobody receives (a wrong tag) times out on both ends, and the
// receiver's error says which tag came instead.
TEST_P(P2pPaths, WrongTagTimesOutOnBothEnds) {
  for (int64_t count : {int64_t{4}, int64_t{100000}}) {
    std::atomic<int> failed{0};
    auto errors = runRanks(2, [&](RankContext& ctx) {
      std::vector<float> buf(count, 1.0f);
      ctx.rt.barrier();
      try {
        if (ctx.rank == 0) {
          ctx.rt.send(makeTensor(buf.data(), {count}, DataType::kFloat32), 1, {0, 5});
        } else {
          ctx.rt.recv(makeTensor(buf.data(), {count}, DataType::kFloat32), 0, {0, 6});
        }
      } catch (const Timeout&) {
        // Both stay up until both timed out: a rank that left would be a peer failure.
        failed += 1;
        while (failed < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        throw;
      }
    }, pathTweak(GetParam(), 1.5));
    EXPECT_NE(errors[0].find("rank 0 sending " + std::to_string(count * 4) + " bytes (float32) with tag 5 in process set 0 to rank 1 timed out"),
              std::string::npos) << errors[0];
    EXPECT_NE(errors[1].find("rank 1 receiving " + std::to_string(count * 4) + " bytes (float32) with tag 6 in process set 0 from rank 0 timed out"),
              std::string::npos) << errors[1];
    EXPECT_NE(errors[1].find("rank 0 sent with tag(s) 5 (set 0) instead"), std::string::npos) << errors[1];
  }
}

// A peer that goes away (here: shuts down) fails the ops waiting on it at once,
// long before the timeout; the runtime stays usable for collectives.
TEST_P(P2pPaths, PeerGoneFailsWaitersAtOnce) {
  std::atomic<bool> failedFast{false};
  auto errors = runRanks(3, [&](RankContext& ctx) {
    std::vector<float> buf(1000, 0.0f);
    if (ctx.rank == 2) return;  // takes no part
    if (ctx.rank == 1) {
      ctx.rt.send(makeTensor(buf.data(), {1}, DataType::kFloat32), 0, {0, 0});  // connects
      ctx.rt.shutdown();
      return;
    }
    ctx.rt.recv(makeTensor(buf.data(), {1}, DataType::kFloat32), 1, {0, 0});
    const auto start = std::chrono::steady_clock::now();
    try {
      ctx.rt.recv(makeTensor(buf.data(), {1000}, DataType::kFloat32), 1, {0, 1});
    } catch (const PeerFailure& e) {
      failedFast = std::chrono::steady_clock::now() - start < std::chrono::seconds(10);
      EXPECT_NE(std::string(e.what()).find("peer failure: rank 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0 receiving 4000 bytes (float32) with tag 1"), std::string::npos) << e.what();
    }
  }, pathTweak(GetParam(), 30));
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_TRUE(failedFast);
  EXPECT_EQ(leftovers(), 0);
}

INSTANTIATE_TEST_SUITE_P(Paths, P2pPaths, ::testing::ValuesIn(kPaths), [](const auto& info) { return std::string(info.param.name); });

// Within a process set: peers are global ranks of the set, tags are the set's
// own, and a rank outside the set is refused with the set named.
TEST(P2p, ProcessSets) {
  runRanksOk(4, [&](RankContext& ctx) {
    ProcessSet odd = ctx.rt.addProcessSet({1, 3});
    std::vector<int32_t> v(16, ctx.rank), w(16, -1), x(16, -1);
    if (ctx.rank == 1) {
      ctx.rt.send(makeTensor(v.data(), {16}, DataType::kInt32), 3, {odd.id(), 0});
      ctx.rt.send(makeTensor(v.data(), {8}, DataType::kInt32), 3, {kGlobalProcessSetId, 0});
    } else if (ctx.rank == 3) {
      // The same tag in another set is another message: the global one (8) first.
      auto global = ctx.rt.recvAsync(makeTensor(x.data(), {8}, DataType::kInt32), 1, {kGlobalProcessSetId, 0});
      ctx.rt.recv(makeTensor(w.data(), {16}, DataType::kInt32), 1, {odd.id(), 0});
      global.wait();
      EXPECT_EQ(w[15], 1);
      EXPECT_EQ(x[7], 1);
      EXPECT_EQ(x[8], -1);
      try {
        ctx.rt.send(makeTensor(v.data(), {1}, DataType::kInt32), 2, {odd.id(), 0});
        ADD_FAILURE() << "a peer outside the set was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("rank 2, which is not in process set " + std::to_string(odd.id()) + " (ranks [1, 3])"),
                  std::string::npos) << e.what();
      }
    } else {
      EXPECT_THROW(ctx.rt.send(makeTensor(v.data(), {1}, DataType::kInt32), 1, {odd.id(), 0}), InvalidArgument);
    }
    ctx.rt.removeProcessSet(odd.id());
  }, [](Config& c) { c.dynamicProcessSets = true; });
}

}  // namespace
}  // namespace chorus::testing
