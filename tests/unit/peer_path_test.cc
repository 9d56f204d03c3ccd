// The streamed copies of the shared-memory transport, and the choice between
// passing large collectives' data through the caches or through memory.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "chorus/error.h"
#include "comm/shm/peer_path.h"
#include "comm/shm/stream_copy.h"
#include "harness.h"

namespace chorus::testing {
namespace {

// Named Kernels.* so that ctest runs it at every instruction-set level too.
TEST(Kernels, StreamCopyEveryAlignmentAndLength) {
  std::vector<char> src(5000), dst(5200), also(5200);
  std::iota(src.begin(), src.end(), 1);
  for (size_t srcOff : {0, 3, 32}) {
    for (size_t dstOff : {0, 1, 16, 40, 64}) {
      for (size_t alsoOff : {0, 8, 32, 64}) {
        for (size_t n : {0, 1, 63, 64, 65, 127, 128, 1000, 4096 + 17}) {
          for (int mode = 0; mode < 3; ++mode) {  // no also; also cached; also streamed
            std::fill(dst.begin(), dst.end(), 0);
            std::fill(also.begin(), also.end(), 0);
            char* a = mode ? also.data() + alsoOff : nullptr;
            streamCopy(dst.data() + dstOff, src.data() + srcOff, n, a, mode == 2);
            SCOPED_TRACE(::testing::Message() << "src+" << srcOff << " dst+" << dstOff << " also+" << alsoOff
                                              << " n " << n << " mode " << mode);
            ASSERT_EQ(std::memcmp(dst.data() + dstOff, src.data() + srcOff, n), 0);
            // Nothing around the copy is touched.
            for (size_t i = 0; i < dstOff; ++i) ASSERT_EQ(dst[i], 0);
            for (size_t i = dstOff + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0);
            if (a) {
              ASSERT_EQ(std::memcmp(a, src.data() + srcOff, n), 0);
              for (size_t i = alsoOff + n; i < also.size(); ++i) ASSERT_EQ(also[i], 0);
            }
          }
        }
      }
    }
  }
}

TEST(Kernels, CopyBytesEveryAlignmentAndLength) {
  std::vector<char> src(5000), dst(5200);
  std::iota(src.begin(), src.end(), 1);
  for (size_t srcOff : {0, 3, 16, 32}) {
    for (size_t dstOff : {0, 1, 16, 40, 64}) {
      for (size_t n : {0, 1, 63, 255, 256, 257, 319, 320, 1000, 4096 + 17}) {
        std::fill(dst.begin(), dst.end(), 0);
        copyBytes(dst.data() + dstOff, src.data() + srcOff, n);
        SCOPED_TRACE(::testing::Message() << "src+" << srcOff << " dst+" << dstOff << " n " << n);
        ASSERT_EQ(std::memcmp(dst.data() + dstOff, src.data() + srcOff, n), 0);
        for (size_t i = 0; i < dstOff; ++i) ASSERT_EQ(dst[i], 0);
        for (size_t i = dstOff + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0);
      }
    }
  }
}

constexpr int kOp = 0;
constexpr size_t kBytes = 64 << 20;

// Feeds the chooser: each path takes `cache` or `memory` seconds per call.
std::vector<bool> run(PeerPathChooser& c, int calls, double cache, double memory, int op = kOp,
                      size_t bytes = kBytes) {
  std::vector<bool> picks;
  for (int i = 0; i < calls; ++i) {
    const bool m = c.viaMemory(op, bytes);
    c.record(op, bytes, m, m ? memory : cache);
    picks.push_back(m);
  }
  return picks;
}

int memoryCount(const std::vector<bool>& picks, size_t from = 0) {
  return static_cast<int>(std::count(picks.begin() + from, picks.end(), true));
}

TEST(PeerPath, TriesBothThenKeepsTheFasterAndRetriesTheOther) {
  PeerPathChooser c;
  const auto picks = run(c, 4 + 64, 0.010, 0.009);  // within kFarApart of each other
  EXPECT_EQ(memoryCount(picks, 0) - memoryCount(picks, 4), 2);  // the first four alternate
  // Then memory, except one call in kExploreEvery.
  EXPECT_EQ(memoryCount(picks, 4), 64 - 64 / PeerPathChooser::kExploreEvery);

  PeerPathChooser d;
  EXPECT_EQ(memoryCount(run(d, 4 + 64, 0.009, 0.010), 4), 64 / PeerPathChooser::kExploreEvery);
}

TEST(PeerPath, PathsFarApartAreRetriedMoreRarely) {
  static_assert(PeerPathChooser::kExploreRarely > PeerPathChooser::kExploreEvery);
  PeerPathChooser c;
  const auto picks = run(c, 4 + 64, 0.010, 0.006);  // cache 1.67x slower
  EXPECT_EQ(memoryCount(picks, 4), 64 - 64 / PeerPathChooser::kExploreRarely);
  PeerPathChooser d;
  EXPECT_EQ(memoryCount(run(d, 4 + 64, 0.006, 0.010), 4), 64 / PeerPathChooser::kExploreRarely);
}

TEST(PeerPath, ARarelyTriedPathThatBecameFasterIsTakenAgain) {
  PeerPathChooser c;
  run(c, 40, 0.010, 0.020);  // memory far slower: tried one call in kExploreRarely
  // Then memory gets 4x faster: three tries (a median of five) bring it back.
  const auto later = run(c, 4 * PeerPathChooser::kExploreRarely + 32, 0.010, 0.005);
  EXPECT_GE(memoryCount(later, 4 * PeerPathChooser::kExploreRarely), 28);
}

TEST(PeerPath, FollowsAChangeOfTheMachine) {
  PeerPathChooser c;
  run(c, 40, 0.006, 0.010);  // caches faster
  const auto later = run(c, 80, 0.020, 0.010);  // then cache-to-cache transfers slow down
  EXPECT_GE(memoryCount(later, 40), 40 - 40 / PeerPathChooser::kExploreEvery);
}

TEST(PeerPath, OneSlowCallDoesNotFlipTheChoice) {
  PeerPathChooser c;
  int cacheCalls = 0, memoryPicks = 0;
  for (int i = 0; i < 4 + 80; ++i) {
    const bool m = c.viaMemory(kOp, kBytes);
    // The cache path is bimodal: one call in four is slow, the others fast.
    const double t = m ? 0.010 : (cacheCalls++ % 4 == 3 ? 0.030 : 0.006);
    c.record(kOp, kBytes, m, t);
    if (i >= 4) memoryPicks += m;
  }
  EXPECT_LE(memoryPicks, 80 / PeerPathChooser::kExploreEvery + 1);
}

TEST(PeerPath, KindsAndSizesAreMeasuredApart) {
  PeerPathChooser c;
  run(c, 40, 0.010, 0.006, 0, kBytes);        // allgather of 64 MiB: memory faster
  run(c, 40, 0.001, 0.004, 0, 4 << 20);       // allgather of 4 MiB: caches faster
  run(c, 40, 0.010, 0.020, 2, kBytes);        // another op of 64 MiB: caches faster
  EXPECT_GE(memoryCount(run(c, 16, 0.010, 0.006, 0, kBytes)), 14);
  EXPECT_LE(memoryCount(run(c, 16, 0.001, 0.004, 0, 4 << 20)), 2);
  EXPECT_LE(memoryCount(run(c, 16, 0.010, 0.020, 2, kBytes)), 2);
}

TEST(PeerPath, ASettingForcesOnePath) {
  PeerPathChooser cache(PeerPath::kCache), memory(PeerPath::kMemory);
  EXPECT_EQ(memoryCount(run(cache, 20, 0.020, 0.001)), 0);
  EXPECT_EQ(memoryCount(run(memory, 20, 0.001, 0.020)), 20);
}

TEST(PeerPath, ParsesTheSetting) {
  EXPECT_EQ(parsePeerPath("auto"), PeerPath::kAuto);
  EXPECT_EQ(parsePeerPath("cache"), PeerPath::kCache);
  EXPECT_EQ(parsePeerPath("memory"), PeerPath::kMemory);
  try {
    parsePeerPath("dram");
    FAIL() << "accepted a bad value";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("CHORUS_SHM_PEER_PATH='dram'"), std::string::npos) << e.what();
  }
}

// The backend checks its own settings (checkCommOptions), when init() starts.
TEST(PeerPath, InitRefusesBadBackendSettingsNamingThem) {
  auto errors = runRanks(1, [](RankContext&) {}, [](Config& c) { c.shmPeerPath = "dram"; });
  EXPECT_NE(errors[0].find("CHORUS_SHM_PEER_PATH='dram'"), std::string::npos) << errors[0];
  errors = runRanks(1, [](RankContext&) {}, [](Config& c) { c.shmSlotBytes = 100; });
  EXPECT_NE(errors[0].find("CHORUS_SHM_SLOT_BYTES"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace chorus::testing
