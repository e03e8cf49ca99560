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

// A push refused before it was taken that its client sends again under the same number (a
// push counted in another server's sequence, refused for its map version) leaves a gap too,
// also for a client this table has not seen: a later push of the sequence is blocked rather
// than taken, which would put the mark above the refused one (its resend then answered as a
// retry and applied nowhere).
TEST(PushDedup, APushRefusedBeforeItWasTakenBlocksTheLaterOnesUntilItComesAgain) {
  PushDedup d(std::chrono::milliseconds(60'000));
  d.Refused(9, 77);  // a client never seen here
  d.Refused(9, 78);  // refused in the same burst
  EXPECT_EQ(d.Check(9, 79), V::kBlocked);  // taken once the server had the map
  EXPECT_EQ(d.Check(9, 78), V::kBlocked);  // its turn comes after 77
  EXPECT_EQ(d.Check(9, 77), V::kNew);      // the resend
  d.Accept(9, 77);
  // 78 is still on its way: 79 still waits for it.
  EXPECT_EQ(d.Check(9, 79), V::kBlocked);
  EXPECT_EQ(d.Check(9, 78), V::kNew);
  d.Accept(9, 78);
  EXPECT_EQ(d.Check(9, 79), V::kNew);
  d.Logged(9, 78);
  // A retry of a logged push refused for its map: nothing to wait for.
  d.Refused(9, 77);
  EXPECT_EQ(d.Check(9, 79), V::kNew);
  EXPECT_EQ(d.Check(9, 77), V::kApplied);
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

// Issue 35, item 12: past the cap the least recently seen clients go to the store, not away;
// a retry of a spilled client's push is still answered "already applied" (it was kNew, and
// applied twice, when the table dropped that quarter).
TEST(PushDedup, SpillsTheLeastRecentlySeenToTheStoreInsteadOfForgettingThem) {
  std::unique_ptr<StorageEngine> store = NewMemoryStorageEngine();
  constexpr size_t kCap = 64;
  PushDedup d(PushDedupOptions{.max_clients = kCap}, store.get());
  for (uint64_t c = 1; c <= kCap; ++c) d.Logged(c, 1);
  d.Logged(1, 2);  // client 1 is now the most recent
  d.Accept(3, 2);  // client 3 has a push in flight: it stays in memory
  for (uint64_t c = 1000; c < 1000 + 10 * kCap; ++c) d.Logged(c, 1);  // new clients, once each
  EXPECT_LE(d.size(), kCap);
  EXPECT_GT(d.spilled(), 0u);
  EXPECT_EQ(d.Check(1, 2), V::kApplied);
  EXPECT_EQ(d.Check(2, 1), V::kApplied);  // among the oldest: spilled, still known
  EXPECT_EQ(d.Check(2, 2), V::kNew);
  EXPECT_EQ(d.Check(3, 2), V::kPending);
  EXPECT_EQ(d.Check(1000, 1), V::kApplied);
  // Back from the store with its mark.
  d.Accept(2, 2);
  d.Logged(2, 2);
  EXPECT_EQ(d.Check(2, 2), V::kApplied);
  EXPECT_EQ(d.Check(2, 3), V::kNew);

  // A restart: the in-memory marks come back from the stored record, the rest from the store.
  PushDedup again(PushDedupOptions{.max_clients = kCap}, store.get());
  ASSERT_TRUE(again.Merge(d.Encode()).ok());
  for (uint64_t c : {uint64_t{1}, uint64_t{2}, uint64_t{5}, uint64_t{1000}, uint64_t{1500}}) {
    EXPECT_EQ(again.Check(c, 1), V::kApplied) << "client " << c;
  }
  EXPECT_EQ(again.Check(2, 2), V::kApplied);
}

// A client known neither in memory nor in the store: its first push is new, a later one may
// be the retry of a push whose mark is gone (kUnknown: the server refuses it, never applies
// it blind).
TEST(PushDedup, AClientKnownNowhereIsNewOnlyWithItsFirstPush) {
  std::unique_ptr<StorageEngine> store = NewMemoryStorageEngine();
  PushDedup d(PushDedupOptions{}, store.get());
  EXPECT_EQ(d.Check(42, 1), V::kNew);
  EXPECT_EQ(d.Check(42, 7), V::kUnknown);
  d.Accept(42, 1);
  EXPECT_EQ(d.Check(42, 2), V::kNew);  // known now
  PushDedup no_store;
  EXPECT_EQ(no_store.Check(43, 2), V::kUnknown);
  EXPECT_EQ(no_store.Check(0, 2), V::kNew);  // no id: never deduplicated
}

// Past the retention a client is forgotten: not spilled, and its spilled mark deleted (a
// sixteenth of the key space per spill); its later push is then kUnknown.
TEST(PushDedup, ForgetsClientsNotSeenForTheRetention) {
  std::unique_ptr<StorageEngine> store = NewMemoryStorageEngine();
  constexpr size_t kCap = 8;
  PushDedup keep(PushDedupOptions{.max_clients = kCap}, store.get());
  for (uint64_t c = 1; c <= 4 * kCap; ++c) keep.Logged(c, 3);
  ASSERT_GT(keep.spilled(), 0u);
  EXPECT_EQ(keep.Check(1, 3), V::kApplied);

  PushDedup forget(PushDedupOptions{.max_clients = kCap, .retention_s = 0}, store.get());
  EXPECT_EQ(forget.Check(1, 3), V::kApplied);                              // still stored
  for (uint64_t c = 1000; c < 1000 + 40 * kCap; ++c) forget.Logged(c, 1);  // >= 16 spills
  EXPECT_EQ(forget.spilled(), 0u);  // every client was past the retention
  EXPECT_GT(forget.expired(), 0u);
  EXPECT_EQ(forget.Check(1, 3), V::kUnknown);
  EXPECT_EQ(forget.Check(1000, 2), V::kUnknown);
  size_t left = 0;
  ASSERT_TRUE(store->ScanMeta(PushDedup::kStorePrefix, [&](auto, auto) { ++left; }).ok());
  EXPECT_EQ(left, 0u);
}

}  // namespace
}  // namespace tessera::internal
