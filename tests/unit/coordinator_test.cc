// The coordinator's decisions from hand-made request sequences (no transport).
#include <gtest/gtest.h>

#include "core/coordinator.h"

namespace chorus {
namespace {

Request allreduce(const std::string& name, int64_t elements) {
  Request q;
  q.name = name;
  q.shape = {elements};
  return q;
}

Request marker(const std::string& name, int32_t conflictSet) {
  Request q;
  q.type = OpType::kBarrier;
  q.name = name;
  q.conflictSet = conflictSet;
  return q;
}

// Rank 1 marks 'w' (its use is on set 1) before rank 2 has submitted it here,
// and in the same message already sends its next use of 'w' on this set. The
// earlier use fails once rank 2 is in; the next one must still be counted, so
// that it completes with the others' next use (it was dropped, and hung).
TEST(Coordinator, ANextUseAfterTheSameRanksMarkerWaitsForTheMarkedEntry) {
  const auto now = Coordinator::Clock::now();
  Coordinator c({0, 1, 2}, 0);
  c.submit(0, allreduce("w", 8), now);
  c.submit(1, marker("w", 1), now);
  c.submit(1, allreduce("w", 2), now);
  EXPECT_TRUE(c.takeReady().empty());
  c.submit(2, allreduce("w", 8), now);
  auto failed = c.takeReady();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].errorKind, ErrorKind::kMismatch);
  EXPECT_EQ(failed[0].markedRanks, std::vector<int>{1});
  EXPECT_EQ(c.missingByName().at("w"), (std::vector<int>{0, 2}));  // rank 1's next use is in
  c.submit(0, allreduce("w", 2), now);
  c.submit(2, allreduce("w", 2), now);
  auto done = c.takeReady();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].errorKind, ErrorKind::kNone) << done[0].error;
  EXPECT_EQ(done[0].name, "w");
}

}  // namespace
}  // namespace chorus
