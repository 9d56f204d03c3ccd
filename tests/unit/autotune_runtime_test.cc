// Autotune in a running job: the set's first rank samples its traffic and
// publishes settings in the negotiation; every rank applies them in the same
// cycle (another rank sees them change), results stay right, and the job
// ends on the logged best: over shared memory (with its peer path and slot size)
// and over two simulated hosts (with the hierarchical paths).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <unistd.h>

#include "harness.h"

namespace chorus::testing {
namespace {

// The log's "best" row: fusion, cycle, cache, peer path, slot, hierarchical allreduce, allgather.
struct Best {
  int64_t fusion = 0;
  double cycleMs = 0;
  int cache = 0, peerPath = 0;
  int64_t slot = 0;
  int hierAllreduce = 0, hierAllgather = 0;
};

Best readBest(const std::string& log, int* rows) {
  std::ifstream in(log);
  std::string line, bestLine;
  *rows = 0;
  while (std::getline(in, line)) {
    if (line.rfind("best,", 0) == 0) bestLine = line;
    if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) ++*rows;
  }
  Best b;
  EXPECT_FALSE(bestLine.empty());
  for (char& ch : bestLine) ch = ch == ',' ? ' ' : ch;
  std::istringstream row(bestLine.substr(5));
  row >> b.fusion >> b.cycleMs >> b.cache >> b.peerPath >> b.slot >> b.hierAllreduce >> b.hierAllgather;
  return b;
}

// Parameter: "shm" (one host: cache, peer path and slot size tuned too) or
// "hier" (two simulated hosts: the hierarchical allreduce/allgather as well).
class Autotune : public ::testing::TestWithParam<std::string> {};

TEST_P(Autotune, RanksApplyTheFirstRanksSettingsTogetherAndEndOnTheBest) {
  const bool hier = GetParam() == "hier";
  const int n = hier ? 4 : 2;
  const std::string log = "/tmp/chorus_autotune_" + GetParam() + std::to_string(::getpid()) + ".csv";
  std::mutex mu;
  std::vector<ProcessSetStats> last(n);
  std::set<std::string> seenByRank1;
  runRanksOk(n, [&](RankContext& c) {
    for (int i = 0; i < 400; ++i) {
      // Up to 200 KiB: rounds of several slots where the slot is small.
      std::vector<float> x(256 + 7000 * (i % 8), 1.0f + c.rank), out(x.size());
      AllreduceOptions o;
      o.op = ReduceOp::kSum;
      o.name = "tuned." + std::to_string(i % 5);
      c.rt.allreduce(Tensor{x.data(), DataType::kFloat32, {static_cast<int64_t>(x.size())}},
                     Tensor{out.data(), DataType::kFloat32, {static_cast<int64_t>(out.size())}}, o);
      const float want = n + n * (n - 1) / 2.0f;
      ASSERT_EQ(out[0], want);
      ASSERT_EQ(out.back(), want);
      if (c.rank == 1) {
        const ProcessSetStats s = c.rt.stats();
        std::ostringstream key;
        key << s.fusionThresholdBytes << ' ' << s.cycleTimeMs << ' ' << s.responseCache << ' ' << s.shmPeerPath
            << ' ' << s.shmSlotBytes << ' ' << s.hierarchicalAllreduce << ' ' << s.hierarchicalAllgather;
        seenByRank1.insert(key.str());
      }
    }
    c.rt.barrier();
    std::lock_guard<std::mutex> lock(mu);
    last[c.rank] = c.rt.stats();
  }, [&](Config& cfg) {
    cfg.cpuOperations = hier ? "auto" : "shm";
    if (hier) cfg.hostname = cfg.rank % 2 ? "hostB" : "hostA";
    cfg.shmSlotBytes = 1 << 20;
    cfg.autotune = true;
    cfg.autotuneLog = log;
    cfg.autotuneWarmupSamples = 1;
    cfg.autotuneStepsPerSample = 3;
    cfg.autotuneMaxSamples = 10;
    cfg.autotuneSampleSeconds = 0;  // (samples by cycles alone: the test's job is short)
  });
  EXPECT_GT(seenByRank1.size(), 1u) << "the deciding rank's settings never reached rank 1";
  int rows = 0;
  const Best best = readBest(log, &rows);
  EXPECT_EQ(rows, 10);
  for (int r = 0; r < n; ++r) {  // every rank ends on the logged best
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(last[r].fusionThresholdBytes, best.fusion);
    EXPECT_DOUBLE_EQ(last[r].cycleTimeMs, best.cycleMs);
    EXPECT_EQ(last[r].responseCache, best.cache == 1);
    // (with two hosts: the shared memory within each host's)
    EXPECT_EQ(last[r].shmPeerPath, best.peerPath);
    EXPECT_EQ(last[r].shmSlotBytes, best.slot);
    EXPECT_GE(best.slot, 64 << 10);
    EXPECT_LE(best.slot, 1 << 20);
    EXPECT_EQ(last[r].hierarchicalAllreduce, best.hierAllreduce);
    EXPECT_EQ(last[r].hierarchicalAllgather, best.hierAllgather);
    EXPECT_EQ(best.hierAllreduce >= 0, hier);  // tuned only where the set spans hosts
  }
  std::remove(log.c_str());
}

INSTANTIATE_TEST_SUITE_P(Paths, Autotune, ::testing::Values("shm", "hier"));

}  // namespace
}  // namespace chorus::testing
