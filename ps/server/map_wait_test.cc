#include "ps/server/map_wait_internal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::internal {
namespace {

using V = MapWait::Verdict;

// Push `seq` of client `client`, routed by map `version`, with `bytes` of values.
std::shared_ptr<Pending> Push(uint64_t client, uint64_t seq, uint64_t version,
                              size_t bytes = 16) {
  auto p = std::make_shared<Pending>();
  p->header.op = Op::kSparsePush;
  p->header.client_id = client;
  p->header.client_seq = seq;
  p->header.map_version = version;
  p->frames.emplace_back(std::string(bytes, 'v').data(), bytes);
  return p;
}

// The (client, seq) of each push Readmit serves while the server is at `mine`.
std::vector<std::pair<uint64_t, uint64_t>> Served(MapWait& w, uint64_t mine) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  w.Readmit(mine, [&](const std::shared_ptr<Pending>& p) {
    out.emplace_back(p->header.client_id, p->header.client_seq);
  });
  return out;
}

TEST(MapWait, HoldsAPushAheadAndTheLaterOnesOfItsClientOnly) {
  MapWait w;
  EXPECT_EQ(w.Admit(Push(1, 1, 3), /*mine=*/3), V::kServe);  // at the server's map
  EXPECT_EQ(w.Admit(Push(1, 2, 4), 3), V::kHeld);            // ahead of it
  EXPECT_TRUE(w.Holds(1));
  EXPECT_EQ(w.Admit(Push(1, 3, 3), 3), V::kHeld);     // behind one of its client that waits
  EXPECT_EQ(w.Admit(Push(2, 7, 3), 3), V::kServe);    // another client goes on
  EXPECT_EQ(w.Admit(Push(1, 2, 4), 3), V::kDropped);  // a resend of the held one
  EXPECT_EQ(w.resends_dropped(), 1u);
  EXPECT_EQ(w.size(), 2u);
  EXPECT_EQ(w.bytes(), 32u);
  EXPECT_TRUE(Served(w, 3).empty());  // the map did not move
  const std::vector<std::pair<uint64_t, uint64_t>> in_order = {{1, 2}, {1, 3}};
  EXPECT_EQ(Served(w, 4), in_order);
  EXPECT_TRUE(w.empty());
  EXPECT_FALSE(w.Holds(1));
  EXPECT_EQ(w.bytes(), 0u);
  EXPECT_EQ(w.held_total(), 2u);
}

TEST(MapWait, AClientWhosePushWaitsOnKeepsItsOrderWhileOthersGo) {
  MapWait w;
  ASSERT_EQ(w.Admit(Push(1, 1, 6), 3), V::kHeld);  // waits for 6
  ASSERT_EQ(w.Admit(Push(2, 1, 4), 3), V::kHeld);  // waits for 4
  ASSERT_EQ(w.Admit(Push(2, 2, 4), 3), V::kHeld);
  ASSERT_EQ(w.Admit(Push(1, 2, 4), 3), V::kHeld);  // behind client 1's first, though at 4
  const std::vector<std::pair<uint64_t, uint64_t>> client2 = {{2, 1}, {2, 2}};
  EXPECT_EQ(Served(w, 4), client2);
  EXPECT_TRUE(w.Holds(1));
  EXPECT_EQ(w.size(), 2u);
  const std::vector<std::pair<uint64_t, uint64_t>> client1 = {{1, 1}, {1, 2}};
  EXPECT_EQ(Served(w, 6), client1);
}

TEST(MapWait, PastItsBoundsAPushIsNotHeld) {
  MapWait by_count(/*max_held=*/1);
  ASSERT_EQ(by_count.Admit(Push(1, 1, 4), 3), V::kHeld);
  EXPECT_EQ(by_count.Admit(Push(2, 1, 4), 3), V::kFull);
  EXPECT_EQ(by_count.Admit(Push(1, 2, 4), 3), V::kFull);
  MapWait by_bytes(/*max_held=*/10, /*max_held_bytes=*/100);
  ASSERT_EQ(by_bytes.Admit(Push(1, 1, 4, 60), 3), V::kHeld);
  EXPECT_EQ(by_bytes.Admit(Push(2, 1, 4, 60), 3), V::kFull);
  EXPECT_EQ(by_bytes.Admit(Push(2, 1, 4, 40), 3), V::kHeld);
}

TEST(MapWait, ExpireRefusesOneAheadOfTheStoreAndGivesUpOneHeldTooLongWithItsClient) {
  MapWait w;
  const auto t0 = MapWait::Clock::now();
  ASSERT_EQ(w.Admit(Push(1, 1, 9), 3, /*ticket=*/5, t0), V::kHeld);  // no store has 9
  ASSERT_EQ(w.Admit(Push(2, 1, 4), 3, /*ticket=*/6, t0), V::kHeld);
  ASSERT_EQ(w.Admit(Push(2, 2, 3), 3, 0, t0 + std::chrono::seconds(5)), V::kHeld);
  ASSERT_EQ(w.Admit(Push(3, 1, 4), 3, 7, t0 + std::chrono::seconds(5)), V::kHeld);
  // The re-reads found version 4 stored (before each, nothing).
  auto newest = [](uint64_t ticket) -> std::optional<uint64_t> {
    return ticket >= 5 ? std::optional<uint64_t>(4) : std::nullopt;
  };
  std::vector<MapWait::Expired> out = w.Expire(t0 + std::chrono::seconds(1), newest);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].p->header.client_id, 1u);
  EXPECT_TRUE(out[0].ahead_of_store);
  EXPECT_EQ(w.expired(), 0u);
  // Past the hold limit of client 2's first: its second goes with it, client 3's stays.
  out = w.Expire(t0 + MapWait::kHoldLimit, newest);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].p->header.client_seq, 1u);
  EXPECT_EQ(out[1].p->header.client_seq, 2u);
  EXPECT_FALSE(out[0].ahead_of_store || out[1].ahead_of_store);
  EXPECT_EQ(w.expired(), 2u);
  EXPECT_EQ(w.size(), 1u);
  EXPECT_TRUE(w.Holds(3));
  EXPECT_FALSE(w.Holds(2));
}

TEST(MapWait, APushBehindOneGivenUpGoesAtTheNextReadmitThoughTheMapDidNotMove) {
  MapWait w;
  const auto t0 = MapWait::Clock::now();
  ASSERT_EQ(w.Admit(Push(1, 1, 9), 3, /*ticket=*/1, t0), V::kHeld);
  ASSERT_EQ(w.Admit(Push(1, 2, 3), 3, 0, t0), V::kHeld);  // at the server's map, behind it
  EXPECT_TRUE(Served(w, 3).empty());
  auto newest = [](uint64_t) -> std::optional<uint64_t> { return 3; };
  ASSERT_EQ(w.Expire(t0, newest).size(), 1u);  // the first: ahead of the store
  const std::vector<std::pair<uint64_t, uint64_t>> second = {{1, 2}};
  EXPECT_EQ(Served(w, 3), second);
}

// A worker's Clock that came after its held push on the same connection waits behind it, and
// only behind its own connection's requests; a held push given up lets it go at the next
// Readmit though the map did not move.
TEST(MapWait, AClockWaitsBehindTheHeldPushesOfItsConnectionOnly) {
  MapWait w;
  const auto t0 = MapWait::Clock::now();
  auto with_peer = [](std::shared_ptr<Pending> p, const std::string& peer) {
    p->identity = zmq::message_t(peer.data(), peer.size());
    return p;
  };
  auto clock = [&](const std::string& peer) {
    auto p = with_peer(std::make_shared<Pending>(), peer);
    p->header.op = Op::kClock;
    return p;
  };
  ASSERT_EQ(w.Admit(with_peer(Push(1, 1, 4), "a"), 3, 0, t0), V::kHeld);
  EXPECT_TRUE(w.HoldsPeer(zmq::message_t("a", 1)));
  EXPECT_FALSE(w.HoldsPeer(zmq::message_t("b", 1)));
  ASSERT_EQ(w.AdmitBehindPeer(clock("a"), t0), V::kHeld);
  ASSERT_EQ(w.Admit(with_peer(Push(2, 1, 5), "b"), 3, 0, t0), V::kHeld);
  ASSERT_EQ(w.AdmitBehindPeer(clock("b"), t0), V::kHeld);
  EXPECT_TRUE(Served(w, 3).empty());
  // At 4: peer a's push, then its Clock (client 0, number 0); peer b's wait for 5.
  const std::vector<std::pair<uint64_t, uint64_t>> a = {{1, 1}, {0, 0}};
  EXPECT_EQ(Served(w, 4), a);
  EXPECT_FALSE(w.HoldsPeer(zmq::message_t("a", 1)));
  // Peer b's push is given up (the Clock is not), and its Clock goes next.
  std::vector<MapWait::Expired> out =
      w.Expire(t0 + MapWait::kHoldLimit, [](uint64_t) { return std::nullopt; });
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].p->header.client_id, 2u);
  const std::vector<std::pair<uint64_t, uint64_t>> b = {{0, 0}};
  EXPECT_EQ(Served(w, 4), b);
  EXPECT_TRUE(w.empty());
}

}  // namespace
}  // namespace tessera::internal
