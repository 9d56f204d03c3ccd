// The coordinator's decisions from hand-made request sequences (no transport).
#include <gtest/gtest.h>

#include <functional>

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

// One field of rank 2's request differs from ranks 0 and 1's: the op fails on
// every rank with that field's name and both values in the message; requests that
// agree complete.
TEST(Coordinator, EachFieldThatMustAgreeIsReportedWhenOneRankDiffers) {
  struct Case {
    const char* label;
    OpType type;
    std::function<void(Request&)> differ;
    const char* mine;    // the text of ranks 0-1's value in the message
    const char* theirs;  // rank 2's
  };
  const std::vector<Case> cases = {
      {"operation", OpType::kAllreduce, [](Request& q) { q.type = OpType::kReducescatter; }, "allreduce", "reducescatter"},
      {"dtype", OpType::kAllreduce, [](Request& q) { q.dtype = DataType::kFloat64; }, "float32", "float64"},
      {"shape", OpType::kAllreduce, [](Request& q) { q.shape = {3, 2}; }, "[6]", "[3, 2]"},
      {"reduce op", OpType::kAllreduce, [](Request& q) { q.op = ReduceOp::kMax; }, "sum", "max"},
      {"prescale factor", OpType::kAllreduce, [](Request& q) { q.prescale = 0.5; }, "1", "0.5"},
      {"postscale factor", OpType::kReducescatter, [](Request& q) { q.postscale = 2; }, "1", "2"},
      {"shape", OpType::kBroadcast, [](Request& q) { q.shape = {7}; }, "[6]", "[7]"},
      {"root rank", OpType::kBroadcast, [](Request& q) { q.root = 1; }, "0", "1"},
      {"rank (number of dimensions)", OpType::kAllgather, [](Request& q) { q.shape = {6}; }, "2", "1"},
      {"shape after the first dimension", OpType::kAlltoall,
       [](Request& q) { q.shape = {4, 3}; }, "[2]", "[3]"},
      {"group", OpType::kAllreduce, [](Request& q) { q.group = "g"; q.groupSize = 2; }, "/0", "g/2"},
  };
  const auto now = Coordinator::Clock::now();
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.label) + " of " + opTypeName(k.type));
    Coordinator c({0, 1, 2}, 0);
    Request q = allreduce("t", 6);
    q.type = k.type;
    if (k.type == OpType::kBroadcast) q.root = 0;
    if (k.type == OpType::kAllgather || k.type == OpType::kAlltoall) q.shape = {6, 2};
    if (k.type == OpType::kAlltoall) q.splits = {2, 2, 2};
    Request odd = q;
    k.differ(odd);
    if (k.type == OpType::kAlltoall) odd.splits = {2, 1, 1};
    c.submit(0, q, now);
    c.submit(1, q, now);
    c.submit(2, odd, now);
    auto out = c.takeReady();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].errorKind, ErrorKind::kMismatch);
    const std::string& msg = out[0].error;
    EXPECT_NE(msg.find(std::string("'t': ") + k.label), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string(k.mine) + " on ranks [0, 1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string(k.theirs) + " on ranks [2]"), std::string::npos) << msg;
    // The same requests everywhere agree.
    Coordinator same({0, 1, 2}, 0);
    for (int r = 0; r < 3; ++r) same.submit(r, odd, now);
    auto fine = same.takeReady();
    ASSERT_EQ(fine.size(), k.label == std::string("group") ? 0u : 1u);  // a group waits for its other member
    if (!fine.empty()) {
      EXPECT_EQ(fine[0].errorKind, ErrorKind::kNone) << fine[0].error;
    }
  }
}

// A grouped call whose second member's shapes differ: that member fails on
// every rank, and the first is released (it was held for the group forever).
// The same goes for a member failed by failPending (ranks on different paths).
TEST(Coordinator, AGroupMemberThatFailsReleasesTheOthers) {
  const auto now = Coordinator::Clock::now();
  auto member = [](const std::string& name, int64_t n) {
    Request q = allreduce(name, n);
    q.group = "g1";
    q.groupSize = 2;
    return q;
  };
  Coordinator c({0, 1}, 0);
  c.submit(0, member("a", 4), now);
  c.submit(1, member("a", 4), now);
  EXPECT_TRUE(c.takeReady().empty());  // held for "b"
  c.submit(0, member("b", 2), now);
  c.submit(1, member("b", 3), now);
  auto out = c.takeReady();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "b");
  EXPECT_EQ(out[0].errorKind, ErrorKind::kMismatch);
  EXPECT_EQ(out[1].name, "a");
  EXPECT_EQ(out[1].errorKind, ErrorKind::kNone) << out[1].error;

  Coordinator d({0, 1}, 0);
  Request a = member("a", 4), b = member("b", 4);
  a.group = b.group = "g2";
  d.submit(0, a, now);
  d.submit(1, a, now);
  d.submit(0, b, now);  // rank 1 never submits "b"
  EXPECT_TRUE(d.takeReady().empty());
  d.failPending("blocked");
  auto failed = d.takeReady();
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0].name, "b");
  EXPECT_EQ(failed[0].errorKind, ErrorKind::kStalled);
  EXPECT_EQ(failed[1].name, "a");
}

}  // namespace
}  // namespace chorus
