#include <gtest/gtest.h>

#include "ps/server/dedup_internal.h"

namespace tessera::internal {
namespace {

using V = PushDedup::Verdict;

TEST(PushDedup, RetriesOfLoggedPushesAreApplied) {
  PushDedup d;
  EXPECT_EQ(d.Check(7, 1), V::kNew);
  d.Accept(7, 1);
  EXPECT_EQ(d.Check(7, 1), V::kPending);  // parked, not yet logged
  d.Logged(7, 1);
  EXPECT_EQ(d.Check(7, 1), V::kApplied);
  EXPECT_EQ(d.Check(7, 2), V::kNew);
  EXPECT_EQ(d.Check(8, 1), V::kNew);  // another client
  EXPECT_EQ(d.Check(0, 1), V::kNew);  // no id: never deduplicated
  d.Accept(0, 1);
  d.Logged(0, 1);
  EXPECT_EQ(d.Check(0, 1), V::kNew);
}

TEST(PushDedup, AbandonedPushMayBeRetried) {
  PushDedup d;
  d.Logged(3, 4);
  d.Accept(3, 5);
  d.Abandon(3, 5);  // e.g. the log write failed
  EXPECT_EQ(d.Check(3, 5), V::kNew);
  EXPECT_EQ(d.Check(3, 4), V::kApplied);
}

TEST(PushDedup, MarksSurviveEncodeAndMerge) {
  PushDedup d;
  d.Logged(1, 10);
  d.Logged(2, 20);
  d.Accept(2, 25);  // accepted-only marks are not stored
  PushDedup r;
  r.Logged(1, 12);  // a newer mark (from the log) wins
  ASSERT_TRUE(r.Merge(d.Encode()).ok());
  EXPECT_EQ(r.Check(1, 12), V::kApplied);
  EXPECT_EQ(r.Check(1, 13), V::kNew);
  EXPECT_EQ(r.Check(2, 20), V::kApplied);
  EXPECT_EQ(r.Check(2, 21), V::kNew);
  std::string bytes = d.Encode();
  bytes.pop_back();
  EXPECT_EQ(r.Merge(bytes).code(), StatusCode::kCorruption);
  EXPECT_EQ(r.Merge("").code(), StatusCode::kCorruption);
}

TEST(PushDedup, ForgetsTheLeastRecentlySeenWhenFull) {
  PushDedup d;
  for (uint64_t c = 1; c <= PushDedup::kMaxClients; ++c) d.Logged(c, 1);
  d.Logged(1, 2);  // client 1 is now the most recent
  d.Logged(PushDedup::kMaxClients + 1, 1);
  EXPECT_LE(d.size(), PushDedup::kMaxClients);
  EXPECT_GE(d.size(), PushDedup::kMaxClients * 3 / 4);
  EXPECT_EQ(d.Check(1, 2), V::kApplied);
  EXPECT_EQ(d.Check(2, 1), V::kNew);  // among the oldest: forgotten
  EXPECT_EQ(d.Check(PushDedup::kMaxClients + 1, 1), V::kApplied);
}

}  // namespace
}  // namespace tessera::internal
