#include <gtest/gtest.h>

#include "ps/server/consistency_internal.h"
#include "ps/server/peers_internal.h"

namespace tessera::internal {
namespace {

TEST(ConnectionTable, AdmitsInAcceptOrderAndPromotesWhenOneCloses) {
  ConnectionTable t(2);
  t.Accepted(10);
  t.Accepted(11);
  t.Accepted(12);
  t.Accepted(13);
  EXPECT_TRUE(t.admitted(10));
  EXPECT_TRUE(t.admitted(11));
  EXPECT_FALSE(t.admitted(12));
  EXPECT_FALSE(t.admitted(13));
  EXPECT_TRUE(t.admitted(99));  // not reported by the monitor yet
  t.Closed(11);
  EXPECT_TRUE(t.admitted(12));  // the oldest refused one takes the place
  EXPECT_FALSE(t.admitted(13));
  t.Closed(13);  // a refused one leaves: nothing changes for the others
  EXPECT_EQ(t.open(), 2u);
  EXPECT_EQ(t.admitted_count(), 2u);
  t.Accepted(11);  // the descriptor is reused by a new connection: refused
  EXPECT_FALSE(t.admitted(11));
  ConnectionTable unlimited(0);
  for (int fd = 0; fd < 100; ++fd) unlimited.Accepted(fd);
  EXPECT_TRUE(unlimited.admitted(99));
}

// Issue 35: connections that finish the handshake and never send (or stop sending) do not lock
// clients out: one that needs a place takes the longest idle one's.
TEST(ConnectionTable, AnIdleConnectionGivesItsPlaceToOneThatNeedsIt) {
  using std::chrono::seconds;
  const auto t0 = std::chrono::steady_clock::now();
  ConnectionTable t(2, std::chrono::milliseconds(10000));
  t.Accepted(10, t0);
  t.Accepted(11, t0 + seconds(1));
  EXPECT_TRUE(t.Active(11, t0 + seconds(2)));
  t.Accepted(12, t0 + seconds(5));  // none idle yet: refused
  EXPECT_FALSE(t.admitted(12));
  EXPECT_FALSE(t.Active(12, t0 + seconds(6)));
  // Connection 10 never sent: idle 10 s after its accept. 12's next request takes its place.
  EXPECT_TRUE(t.Active(12, t0 + seconds(10)));
  EXPECT_FALSE(t.admitted(10));
  EXPECT_TRUE(t.admitted(11));
  EXPECT_EQ(t.idle_displaced(), 1u);
  // A new connection takes the place of 11, idle since its request at 2 s.
  t.Accepted(13, t0 + seconds(12));
  EXPECT_TRUE(t.admitted(13));
  EXPECT_FALSE(t.admitted(11));
  EXPECT_EQ(t.admitted_count(), 2u);
  // Nobody idle: a refused one that sends stays refused; a closed place goes to the oldest.
  EXPECT_FALSE(t.Active(10, t0 + seconds(13)));
  t.Closed(13);
  EXPECT_TRUE(t.admitted(10));
  EXPECT_FALSE(t.admitted(11));
  ConnectionTable never(1, std::chrono::milliseconds(0));
  never.Accepted(1, t0);
  never.Accepted(2, t0 + std::chrono::hours(1));
  EXPECT_FALSE(never.Active(2, t0 + std::chrono::hours(2)));
}

// Issue 35 item 4 (per-source limits): one address cannot take every place. Its connections
// over --max_connections_per_ip wait while others are admitted, take a place of their own
// address when one frees, and may only displace an idle connection of their own address.
TEST(ConnectionTable, OneSourceAddressCannotTakeEveryPlace) {
  using std::chrono::seconds;
  const auto t0 = std::chrono::steady_clock::now();
  ConnectionTable t(4, std::chrono::milliseconds(10000), 2);
  t.Accepted(10, t0, "10.0.0.1");
  t.Accepted(11, t0, "10.0.0.1");
  t.Accepted(12, t0, "10.0.0.1");  // its third: refused although places are free
  EXPECT_TRUE(t.admitted(10));
  EXPECT_TRUE(t.admitted(11));
  EXPECT_FALSE(t.admitted(12));
  EXPECT_TRUE(t.over_source_limit(12));
  EXPECT_EQ(t.admitted_from("10.0.0.1"), 2u);
  t.Accepted(20, t0, "10.0.0.2");
  t.Accepted(21, t0, "10.0.0.2");
  EXPECT_TRUE(t.admitted(20));
  EXPECT_TRUE(t.admitted(21));
  t.Accepted(22, t0, "10.0.0.3");  // the table is full: refused, not for its address
  EXPECT_FALSE(t.admitted(22));
  EXPECT_FALSE(t.over_source_limit(22));
  // A place of 10.0.0.2 frees: the oldest refused one whose address has room takes it (22),
  // not 12, older but whose address is still at its limit.
  t.Closed(21);
  EXPECT_TRUE(t.admitted(22));
  EXPECT_FALSE(t.admitted(12));
  // 10.0.0.1 closes one: 12 takes it.
  t.Closed(10);
  EXPECT_TRUE(t.admitted(12));
  EXPECT_EQ(t.admitted_count(), 4u);
  // Idle displacement: 10.0.0.1 is at its limit, so its new connection may only take the
  // place of an idle one of its own (11, idle since 1 s), not 22's (idle longer, since 0 s).
  EXPECT_TRUE(t.Active(11, t0 + seconds(1)));
  EXPECT_TRUE(t.Active(12, t0 + seconds(11)));
  EXPECT_TRUE(t.Active(20, t0 + seconds(11)));
  t.Accepted(13, t0 + seconds(12), "10.0.0.1");
  EXPECT_TRUE(t.admitted(13));
  EXPECT_FALSE(t.admitted(11));
  EXPECT_TRUE(t.admitted(20));
  EXPECT_TRUE(t.admitted(22));  // idle the longest, but of another address
  EXPECT_EQ(t.admitted_from("10.0.0.1"), 2u);
  // Without a per-source limit, one address takes them all.
  ConnectionTable open(4);
  for (int fd = 0; fd < 4; ++fd) open.Accepted(fd, t0, "10.0.0.1");
  EXPECT_TRUE(open.admitted(3));
}

TEST(PeerTable, InFlightSlotsAreBoundedAndGivenBack) {
  PeerTable t(2);
  const auto now = std::chrono::steady_clock::now();
  auto a = t.Admit("peer-a", now);
  auto b = t.Admit("peer-a", now);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = t.Admit("peer-a", now);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(t.Admit("peer-b", now).ok());  // another peer has its own slots
  EXPECT_EQ(t.in_flight("peer-a"), 2u);
  a = Status::Cancelled("dropped");  // the request is gone: its slot comes back
  EXPECT_EQ(t.in_flight("peer-a"), 1u);
  EXPECT_TRUE(t.Admit("peer-a", now).ok());
}

TEST(PeerTable, StalledPeersAndSweep) {
  PeerTable t(0);
  const auto now = std::chrono::steady_clock::now();
  t.MarkStalled("p", now);
  EXPECT_TRUE(t.stalled("p"));
  EXPECT_EQ(t.stalled_count(), 1u);
  t.ClearStalled("p");
  EXPECT_FALSE(t.stalled("p"));
  auto held = t.Admit("q", now);
  ASSERT_TRUE(held.ok());
  t.Sweep(now + std::chrono::seconds(1));  // both idle; q still has a request in flight
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.in_flight("q"), 1u);
}

TEST(Consistency, MinClockCostsTheClocksHeldNotTheWorkerCount) {
  Consistency c;
  EXPECT_EQ(c.MinClock(0xFFFFFFFFu), 0);
  c.SetClock(0, 5, 2);
  c.SetClock(1, 7, 2);
  c.SetClock(9, 1, 10);
  EXPECT_EQ(c.MinClock(2), 5);
  EXPECT_EQ(c.MinClock(3), 0);  // worker 2 not heard from
  EXPECT_EQ(c.MinClock(1), 5);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100000; ++i) ASSERT_EQ(c.MinClock(0xFFFFFFFFu), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

}  // namespace
}  // namespace tessera::internal
