// The shared-memory segment's view of the cores: ranks confined to fewer cores
// than there are ranks are oversubscribed, whatever the machine has.
#include <gtest/gtest.h>

#include <sched.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "chorus/store.h"
#include "comm/shm/shm_segment.h"

namespace chorus::testing {
namespace {

// Ranks as threads, rank r confined to cpus[r]; returns what each segment decided.
std::vector<bool> oversubscribedWith(const std::vector<std::vector<int>>& cpus) {
  const int n = static_cast<int>(cpus.size());
  auto store = makeMemoryStore();
  std::vector<int> seen(n, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : cpus[r]) CPU_SET(c, &set);
      if (sched_setaffinity(0, sizeof(set), &set) != 0) return;
      ShmSegment seg(*store, "seg", "affinity-test", r, n, 4096, std::chrono::seconds(20), std::chrono::seconds(20));
      seen[r] = seg.oversubscribed();
    });
  }
  for (auto& t : ranks) t.join();
  std::vector<bool> out;
  for (int v : seen) {
    EXPECT_GE(v, 0) << "a rank could not be confined or did not finish";
    out.push_back(v == 1);
  }
  return out;
}

TEST(ShmSegment, RanksConfinedToOneCoreAreOversubscribed) {
  EXPECT_EQ(oversubscribedWith({{0}, {0}}), (std::vector<bool>{true, true}));
  EXPECT_EQ(oversubscribedWith({{0}, {0}, {0}}), (std::vector<bool>{true, true, true}));
}

TEST(ShmSegment, RanksOnCoresOfTheirOwnAreNot) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two cores";
  EXPECT_EQ(oversubscribedWith({{0}, {1}}), (std::vector<bool>{false, false}));
  // Together they may use two cores, though each is confined to one.
  EXPECT_EQ(oversubscribedWith({{0, 1}, {1}}), (std::vector<bool>{false, false}));
  EXPECT_EQ(oversubscribedWith({{0}, {1}, {0, 1}}), (std::vector<bool>{true, true, true}));
}

}  // namespace
}  // namespace chorus::testing
