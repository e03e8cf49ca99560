#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ps/server/replication_queue_internal.h"

namespace tessera::internal {
namespace {

std::shared_ptr<Pending> Request(Op op, uint64_t client = 0, uint64_t seq = 0) {
  auto p = std::make_shared<Pending>();
  p->header.op = op;
  p->header.client_id = client;
  p->header.client_seq = seq;
  return p;
}

// A queue whose entries, once released, append their name to `released`.
struct Fixture {
  ReplicationQueue queue{/*stream=*/77};
  std::vector<std::string> released;
  uint64_t next_id = 1;

  ReplEntry& Add(const std::string& name, std::shared_ptr<Pending> p, std::vector<uint16_t> backups,
                 uint64_t version = 1) {
    ReplEntry& e = queue.Enqueue(
        std::move(p), [this, name] { released.push_back(name); }, version);
    for (uint16_t b : backups) {
      ReplPiece piece;
      piece.backup = b;
      piece.request_id = next_id++;
      piece.slots = {static_cast<uint32_t>(b)};
      e.pieces.push_back(std::move(piece));
    }
    queue.Track(e);
    return e;
  }
};

TEST(ReplicationQueue, ReleasesInArrivalOrderOnceTheHeadsBackupsAnswered) {
  Fixture f;
  ReplEntry& a = f.Add("a", Request(Op::kSparsePush, 1, 1), {2, 3});
  f.Add("b", Request(Op::kSparsePull), {});  // a read waits behind earlier pushes
  ReplEntry& c = f.Add("c", Request(Op::kSparsePush, 2, 1), {2});
  EXPECT_EQ(f.queue.waiting(), 3u);
  EXPECT_EQ(f.queue.replicated(), 2u);  // the pull forwards nothing
  f.queue.ReleaseReady();
  EXPECT_TRUE(f.released.empty());
  auto [entry, index] = f.queue.Find(c.pieces[0].request_id);
  ASSERT_EQ(entry, &c);
  f.queue.PieceDone(*entry, index);
  f.queue.PieceDone(*entry, index);  // a second answer counts once
  EXPECT_EQ(f.queue.Find(c.pieces[0].request_id).first, nullptr);
  f.queue.ReleaseReady();
  EXPECT_TRUE(f.released.empty());  // c waits behind a
  f.queue.PieceDone(a, 0);
  f.queue.ReleaseReady();
  EXPECT_TRUE(f.released.empty());
  f.queue.PieceDone(a, 1);
  f.queue.ReleaseReady();
  EXPECT_EQ(f.released, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(f.queue.empty());
  EXPECT_EQ(f.queue.waiting(), 0u);
}

TEST(ReplicationQueue, AFailedPushFailsTheUntakenPushesOfItsClientBehindIt) {
  Fixture f;
  f.Add("before", Request(Op::kSparsePush, 5, 1), {2});
  ReplEntry& first = f.Add("first", Request(Op::kSparsePush, 5, 2), {2});
  f.Add("other client", Request(Op::kSparsePush, 6, 1), {2});
  f.Add("pull", Request(Op::kSparsePull, 5, 0), {});
  ReplEntry& taken = f.Add("taken", Request(Op::kSparsePush, 5, 3), {2});
  taken.pieces[0].acked = true;  // its backup holds it: it goes on
  f.Add("later", Request(Op::kDensePush, 5, 4), {2});
  std::vector<ReplEntry*> failed = f.queue.Fail(first);
  std::vector<uint64_t> seqs;
  for (ReplEntry* e : failed) seqs.push_back(e->p->header.client_seq);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{4, 2}));  // latest first
  EXPECT_EQ(f.queue.failed(), 2u);
  EXPECT_TRUE(f.queue.Fail(first).empty());  // once
  // The failed ones wait for nothing and are never released.
  f.queue.PieceDone(*f.queue.Find(1).first, f.queue.Find(1).second);  // "before"
  f.queue.ReleaseReady();
  EXPECT_EQ(f.released, (std::vector<std::string>{"before"}));
  for (uint64_t id : {3, 4}) {
    auto [e, i] = f.queue.Find(id);
    ASSERT_NE(e, nullptr) << id;
    f.queue.PieceDone(*e, i);
  }
  f.queue.ReleaseReady();
  EXPECT_EQ(f.released, (std::vector<std::string>{"before", "other client", "pull", "taken"}));
  EXPECT_TRUE(f.queue.empty());
}

TEST(ReplicationQueue, UnansweredPiecesAreDueAgainAndOrphansExpire) {
  Fixture f;
  const auto t0 = std::chrono::steady_clock::now();
  ReplEntry& a = f.Add("a", Request(Op::kSparsePush, 1, 1), {2});
  ReplEntry& b = f.Add("b", Request(Op::kSparsePush, 1, 2), {3});
  a.pieces[0].sent_at = t0;
  b.pieces[0].sent_at = t0 - ReplicationQueue::kReplicaResend;
  std::vector<ReplPiece*> due;
  EXPECT_TRUE(f.queue.Due(t0, &due).empty());
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0], &b.pieces[0]);
  a.orphaned = t0 - ReplicationQueue::kOrphanLimit;
  due.clear();
  std::vector<ReplEntry*> orphans = f.queue.Due(t0, &due);
  ASSERT_EQ(orphans.size(), 1u);
  EXPECT_EQ(orphans[0], &a);
}

TEST(ReplicationQueue, AMapChangeDropsAGoneBackupAndOrphansAMovedSlot) {
  Fixture f;
  ReplEntry& a = f.Add("a", Request(Op::kSparsePush, 1, 1), {2});  // slot 2, backup 2
  ReplEntry& b = f.Add("b", Request(Op::kSparsePush, 1, 2), {3});  // slot 3, backup 3
  ClusterMapState map;
  map.version = 2;
  std::vector<uint16_t> owners(kNumSlots, 0);
  owners[3] = 1;  // slot 3 moved away from server 0
  map.primary = *SlotMap::FromOwners(owners, 4);
  map.backup.assign(kNumSlots, RoutingMap::kNoBackup);  // backup 2 dropped from slot 2
  map.backup[3] = 3;
  f.queue.MapChanged(map, /*rank=*/0);
  EXPECT_TRUE(a.pieces[0].done);  // no longer waits for the dropped backup
  EXPECT_FALSE(b.pieces[0].done);
  EXPECT_NE(b.orphaned, std::chrono::steady_clock::time_point{});  // waits for its answer
  absl::flat_hash_set<uint16_t> used;
  f.queue.AddWaitingBackups(&used);
  EXPECT_EQ(used, (absl::flat_hash_set<uint16_t>{3}));
  f.queue.ReleaseReady();
  EXPECT_EQ(f.released, (std::vector<std::string>{"a"}));
}

TEST(ReplicationQueue, ForwardedPushesKeepTheClientsNumbersOrTakeThePrimarysStream) {
  ReplicationQueue queue(/*stream=*/77);
  auto client = Request(Op::kSparsePush, /*client=*/123, /*seq=*/9);
  client->origin_client = 5;  // keyed by origin; 5 is the client's own id
  Header r = queue.ForwardedHeader(*client, Op::kSparsePush, /*map_version=*/4, /*rank=*/2);
  EXPECT_EQ(r.replica_from, 3u);
  EXPECT_EQ(r.map_version, 4u);
  EXPECT_EQ(r.client_id, 5u);
  EXPECT_EQ(r.client_seq, 9u);
  EXPECT_EQ(r.client_origin, 3u);  // counted in this primary's sequence
  const uint64_t first_id = r.request_id;
  auto anonymous = Request(Op::kDensePush);
  Header s1 = queue.ForwardedHeader(*anonymous, Op::kDensePush, 4, 2);
  Header s2 = queue.ForwardedHeader(*anonymous, Op::kDensePush, 4, 2);
  EXPECT_EQ(s1.client_id, 77u);
  EXPECT_EQ(s1.client_seq + 1, s2.client_seq);
  EXPECT_EQ(s1.request_id, first_id + 1);
  EXPECT_EQ(s2.request_id, first_id + 2);
}

TEST(ReplicationQueue, ACutWaitsForPushesUpToItAndExportsForOlderMaps) {
  Fixture f;
  auto push = Request(Op::kSparsePush, 1, 1);
  push->header.num_workers = 2;
  push->header.clock = 3;
  f.Add("push", push, {2}, /*version=*/5);
  EXPECT_TRUE(f.queue.WaitsForPushUpTo(3));
  EXPECT_FALSE(f.queue.WaitsForPushUpTo(2));
  EXPECT_TRUE(f.queue.HoldsOlderThan(6));
  EXPECT_FALSE(f.queue.HoldsOlderThan(5));
}

std::shared_ptr<Pending> Forwarded(uint64_t request_id, uint64_t map_version) {
  auto p = Request(Op::kSparsePush, 9, request_id);
  p->header.replica_from = 1;
  p->header.request_id = request_id;
  p->header.map_version = map_version;
  return p;
}

TEST(ReplicaPark, HoldsPushesAheadOfTheMapInOrderAndDropsResends) {
  ReplicaPark park;
  using V = ReplicaPark::Verdict;
  EXPECT_EQ(park.Admit(Forwarded(1, 3), /*mine=*/3), V::kServe);
  EXPECT_EQ(park.Admit(Forwarded(2, 4), 3), V::kHeld);     // ahead of this server's map
  EXPECT_EQ(park.Admit(Forwarded(3, 3), 3), V::kHeld);     // behind one that waits
  EXPECT_EQ(park.Admit(Forwarded(2, 4), 3), V::kDropped);  // the primary's resend
  EXPECT_EQ(park.resends_dropped(), 1u);
  EXPECT_EQ(park.size(), 2u);
  std::vector<uint64_t> served;
  auto serve = [&](const std::shared_ptr<Pending>& p) { served.push_back(p->header.request_id); };
  park.Readmit(3, serve);
  EXPECT_TRUE(served.empty());  // the head is still ahead
  park.Readmit(4, serve);
  EXPECT_EQ(served, (std::vector<uint64_t>{2, 3}));
  EXPECT_TRUE(park.empty());
}

TEST(ReplicaPark, APushHeldForAFillKeepsItsPlaceAndStopsThoseBehindIt) {
  ReplicaPark park;
  auto first = Forwarded(1, 2);
  EXPECT_TRUE(park.HoldForFill(first, /*rank=*/1).ok());  // nothing waits: held at the head
  EXPECT_EQ(park.fill_held_total(), 1u);
  // A new one while others wait is sent again by its primary, never put ahead of them.
  const Status refused = park.HoldForFill(Forwarded(2, 2), 1);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_EQ(park.Admit(Forwarded(3, 2), 2), ReplicaPark::Verdict::kHeld);
  std::vector<uint64_t> served;
  bool fill_done = false;
  auto serve = [&](const std::shared_ptr<Pending>& p) {
    served.push_back(p->header.request_id);
    // The copy is not in yet: the one being readmitted is held again, at the head.
    if (!fill_done) {
      EXPECT_TRUE(park.HoldForFill(p, 1).ok());
    }
  };
  park.Readmit(2, serve);
  EXPECT_EQ(served, (std::vector<uint64_t>{1}));
  EXPECT_EQ(park.size(), 2u);
  fill_done = true;
  park.Readmit(2, serve);
  EXPECT_EQ(served, (std::vector<uint64_t>{1, 1, 3}));
  EXPECT_TRUE(park.empty());
}


// --- Deadlines and bounds (issue: one forged forwarded push stopped a primary for good).

std::shared_ptr<Pending> From(uint32_t primary, uint64_t request_id, uint64_t map_version,
                              size_t bytes = 0) {
  auto p = Forwarded(request_id, map_version);
  p->header.replica_from = primary + 1;
  p->header.client_id = 100 + primary;
  p->header.client_seq = request_id;
  if (bytes > 0) p->frames.emplace_back(bytes);
  return p;
}

std::vector<uint64_t> Ids(const std::vector<ReplicaPark::Refusal>& r) {
  std::vector<uint64_t> ids;
  for (const auto& x : r) ids.push_back(x.p->header.request_id);
  return ids;
}

TEST(ReplicaPark, APushAheadOfTheStoresNewestMapIsRefusedAndThoseBehindItGoOn) {
  ReplicaPark park;
  using V = ReplicaPark::Verdict;
  const auto t0 = ReplicaPark::Clock::now();
  // A forged head: map version UINT64_MAX, waiting for re-read 5.
  EXPECT_EQ(park.Admit(From(1, 1, UINT64_MAX), /*mine=*/3, /*ticket=*/5, t0), V::kHeld);
  EXPECT_EQ(park.Admit(From(1, 2, 3), 3, 0, t0), V::kHeld);  // legit, behind it
  EXPECT_EQ(park.Admit(From(2, 3, 4), 3, 6, t0), V::kHeld);  // legit, ahead: map 4 is stored
  std::optional<uint64_t> newest;  // no re-read answered yet
  auto answered = [&](uint64_t) { return newest; };
  EXPECT_TRUE(park.Expire(t0, answered, /*rank=*/2).empty());
  newest = 4;
  std::vector<ReplicaPark::Refusal> out = park.Expire(t0, answered, 2);
  ASSERT_EQ(Ids(out), (std::vector<uint64_t>{1}));
  EXPECT_EQ(out[0].status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(out[0].status.message().find("newest map stored is version 4"), std::string::npos)
      << out[0].status.ToString();
  EXPECT_EQ(park.refused_ahead(), 1u);
  std::vector<uint64_t> served;
  park.Readmit(4, [&](const std::shared_ptr<Pending>& p) {
    served.push_back(p->header.request_id);
  });
  EXPECT_EQ(served, (std::vector<uint64_t>{2, 3}));
  EXPECT_TRUE(park.empty());
  EXPECT_EQ(park.bytes(), 0u);
}

TEST(ReplicaPark, APushHeldPastItsLimitLeavesWithTheLaterOnesOfItsPrimary) {
  ReplicaPark park;
  const auto t0 = ReplicaPark::Clock::now();
  ASSERT_EQ(park.Admit(From(1, 1, 9), /*mine=*/3, /*ticket=*/0, t0), ReplicaPark::Verdict::kHeld);
  ASSERT_EQ(park.Admit(From(2, 2, 3), 3, 0, t0 + std::chrono::seconds(1)),
            ReplicaPark::Verdict::kHeld);
  ASSERT_EQ(park.Admit(From(1, 3, 3), 3, 0, t0 + std::chrono::seconds(2)),
            ReplicaPark::Verdict::kHeld);
  auto never = [](uint64_t) { return std::optional<uint64_t>(); };  // no store (no loader)
  EXPECT_TRUE(park.Expire(t0 + ReplicaPark::kHoldLimit - std::chrono::seconds(1), never, 2).empty());
  std::vector<ReplicaPark::Refusal> out =
      park.Expire(t0 + ReplicaPark::kHoldLimit, never, 2);
  // The head, and server 1's later push with it (taken before the head's resend, it would
  // hide it); server 2's stays and goes on.
  ASSERT_EQ(Ids(out), (std::vector<uint64_t>{1, 3}));
  for (const auto& r : out) EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(park.expired(), 2u);
  // A resend of a refused one is held anew (not dropped as a copy of a held one).
  EXPECT_EQ(park.Admit(From(1, 1, 9), 3, 0, t0 + ReplicaPark::kHoldLimit),
            ReplicaPark::Verdict::kHeld);
  std::vector<uint64_t> served;
  park.Readmit(3, [&](const std::shared_ptr<Pending>& p) {
    served.push_back(p->header.request_id);
  });
  // Server 2's push goes; the resend waits for its map at the back.
  EXPECT_EQ(served, (std::vector<uint64_t>{2}));
  EXPECT_EQ(park.size(), 1u);
}

TEST(ReplicaPark, APushHeldAgainForAFillKeepsItsDeadline) {
  ReplicaPark park;
  const auto t0 = ReplicaPark::Clock::now();
  auto p = From(1, 1, 2);
  ASSERT_TRUE(park.HoldForFill(p, /*rank=*/2, t0).ok());
  park.Readmit(2, [&](const std::shared_ptr<Pending>& q) {
    EXPECT_TRUE(park.HoldForFill(q, 2, t0 + std::chrono::seconds(20)).ok());
  });
  auto never = [](uint64_t) { return std::optional<uint64_t>(); };
  EXPECT_EQ(Ids(park.Expire(t0 + ReplicaPark::kHoldLimit, never, 2)),
            (std::vector<uint64_t>{1}));
}

TEST(ReplicaPark, HoldsAtMostItsCountAndBytes) {
  ReplicaPark park(/*max_held=*/2, /*max_held_bytes=*/1000);
  using V = ReplicaPark::Verdict;
  EXPECT_EQ(park.Admit(From(1, 1, 9, 600), 3), V::kHeld);
  EXPECT_EQ(park.Admit(From(1, 2, 9, 600), 3), V::kServe);  // over the bytes: its checks refuse it
  EXPECT_EQ(park.Admit(From(1, 3, 9, 400), 3), V::kHeld);
  EXPECT_EQ(park.bytes(), 1000u);
  EXPECT_EQ(park.Admit(From(1, 4, 9), 3), V::kServe);  // over the count
  EXPECT_EQ(park.size(), 2u);
}

TEST(ReplicationQueue, APieceItsBackupNeverAnswersFailsItsEntryAndResendsKeepTheirOrder) {
  Fixture f;
  ReplEntry& a = f.Add("a", Request(Op::kSparsePush, 1, 1), {2});
  ReplEntry& b = f.Add("b", Request(Op::kSparsePush, 1, 2), {2});
  ReplEntry& c = f.Add("c", Request(Op::kSparsePush, 3, 1), {2});
  std::vector<ReplEntry*> more;  // enough that a hash map's order is not the sent order
  for (uint64_t i = 0; i < 60; ++i) {
    more.push_back(&f.Add("more", Request(Op::kSparsePush, 4, i + 1), {2}));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (ReplEntry* e : {&a, &b, &c}) e->pieces[0].sent_at = e->pieces[0].heard = t0;
  for (ReplEntry* e : more) e->pieces[0].sent_at = e->pieces[0].heard = t0;
  std::vector<ReplPiece*> due;
  EXPECT_TRUE(f.queue.Due(t0 + ReplicationQueue::kReplicaResend, &due).empty());
  ASSERT_EQ(due.size(), 63u);
  for (size_t i = 0; i < due.size(); ++i) {
    ASSERT_EQ(due[i]->request_id, i + 1) << "resent out of the order they were first sent";
  }
  // All but a were answered (Unavailable: held there) since; a was not, ever.
  for (ReplEntry* e : more) e->pieces[0].heard = t0 + std::chrono::seconds(40);
  b.pieces[0].heard = c.pieces[0].heard = t0 + std::chrono::seconds(40);
  due.clear();
  std::vector<ReplEntry*> failing = f.queue.Due(t0 + ReplicationQueue::kSilenceLimit, &due);
  EXPECT_EQ(failing, (std::vector<ReplEntry*>{&a}));
  EXPECT_EQ(due.size(), 62u);
}

}  // namespace
}  // namespace tessera::internal
