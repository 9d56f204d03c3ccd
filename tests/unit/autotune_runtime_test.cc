// Autotune in a running job: the set's first rank samples its traffic and
// publishes settings in the negotiation; every rank applies them in the same
// cycle (the other rank sees them change), results stay right, and the job
// ends on the logged best.
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

TEST(Autotune, RanksApplyTheFirstRanksSettingsTogetherAndEndOnTheBest) {
  const std::string log = "/tmp/chorus_autotune_" + std::to_string(::getpid()) + ".csv";
  std::mutex mu;
  std::vector<ProcessSetStats> last(2);
  std::set<int64_t> seenByRank1;
  runRanksOk(2, [&](RankContext& c) {
    for (int i = 0; i < 400; ++i) {
      std::vector<float> x(256 + 64 * (i % 7), 1.0f + c.rank), out(x.size());
      AllreduceOptions o;
      o.op = ReduceOp::kSum;
      o.name = "tuned." + std::to_string(i % 5);
      c.rt.allreduce(Tensor{x.data(), DataType::kFloat32, {static_cast<int64_t>(x.size())}},
                     Tensor{out.data(), DataType::kFloat32, {static_cast<int64_t>(out.size())}}, o);
      ASSERT_EQ(out[0], 3.0f);
      ASSERT_EQ(out.back(), 3.0f);
      if (c.rank == 1) seenByRank1.insert(c.rt.stats().fusionThresholdBytes);
    }
    c.rt.barrier();
    std::lock_guard<std::mutex> lock(mu);
    last[c.rank] = c.rt.stats();
  }, [&](Config& cfg) {
    cfg.autotune = true;
    cfg.autotuneLog = log;
    cfg.autotuneWarmupSamples = 1;
    cfg.autotuneStepsPerSample = 3;
    cfg.autotuneMaxSamples = 8;
  });
  EXPECT_EQ(last[0].fusionThresholdBytes, last[1].fusionThresholdBytes);
  EXPECT_EQ(last[0].cycleTimeMs, last[1].cycleTimeMs);
  EXPECT_GT(seenByRank1.size(), 1u) << "the deciding rank's settings never reached rank 1";
  std::ifstream in(log);
  std::string line, bestLine;
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.rfind("best,", 0) == 0) bestLine = line;
    if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) ++rows;
  }
  EXPECT_EQ(rows, 8);
  ASSERT_FALSE(bestLine.empty());
  std::istringstream best(bestLine.substr(5));
  int64_t threshold = 0;
  char comma = 0;
  double cycleMs = 0;
  best >> threshold >> comma >> cycleMs;
  EXPECT_EQ(threshold, last[0].fusionThresholdBytes);
  EXPECT_DOUBLE_EQ(cycleMs, last[0].cycleTimeMs);
  std::remove(log.c_str());
}

}  // namespace
}  // namespace chorus::testing
