#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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
  d.Abandon(3, 5, /*resend=*/false);  // e.g. the log write failed
  EXPECT_EQ(d.Check(3, 5), V::kNew);
  EXPECT_EQ(d.Check(3, 4), V::kApplied);
}

// A push refused for a resend under its number (Unavailable) leaves a gap: the client's later
// pushes are blocked until it comes again, or the window ends; a refusal the client answers
// with a new number (stale map) closes it.
TEST(PushDedup, LaterPushesWaitForOneRefusedForAResend) {
  PushDedup d(std::chrono::milliseconds(50));
  d.Logged(3, 4);
  d.Accept(3, 5);
  d.Accept(3, 6);  // taken behind it (held, queued for backups)
  d.Abandon(3, 6, /*resend=*/true);  // refused latest first
  d.Abandon(3, 5, /*resend=*/true);
  EXPECT_EQ(d.Check(3, 7), V::kBlocked);  // in flight when 5 was refused
  EXPECT_EQ(d.Check(3, 6), V::kBlocked);
  EXPECT_EQ(d.Check(3, 4), V::kApplied);
  EXPECT_EQ(d.Check(3, 5), V::kNew);  // the resend
  d.Accept(3, 5);
  EXPECT_EQ(d.Check(3, 6), V::kNew);
  d.Accept(3, 6);
  d.Logged(3, 6);
  EXPECT_EQ(d.Check(3, 5), V::kApplied);
  // A gap closed by a refusal the client answers with a new number.
  d.Accept(3, 7);
  d.Abandon(3, 7, /*resend=*/true);
  EXPECT_EQ(d.Check(3, 8), V::kBlocked);
  d.ClearGap(3, 7);
  EXPECT_EQ(d.Check(3, 8), V::kNew);
  // ... or left open: it lasts the window, not longer.
  d.Accept(3, 8);
  d.Abandon(3, 8, /*resend=*/true);
  EXPECT_EQ(d.Check(3, 9), V::kBlocked);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(d.Check(3, 9), V::kNew);
  // A give-back without a resend (an error reply) leaves no gap.
  d.Accept(3, 9);
  d.Abandon(3, 9, /*resend=*/false);
  EXPECT_EQ(d.Check(3, 10), V::kNew);
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
