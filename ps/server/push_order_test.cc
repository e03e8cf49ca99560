#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ps/server/push_order_internal.h"

namespace tessera::internal {
namespace {

std::shared_ptr<Pending> Push(uint64_t client, uint64_t seq, Op op = Op::kSparsePush) {
  auto p = std::make_shared<Pending>();
  p->header.op = op;
  p->header.client_id = client;
  p->header.client_seq = seq;
  return p;
}

std::vector<uint64_t> Seqs(const std::deque<std::shared_ptr<Pending>>& held) {
  std::vector<uint64_t> out;
  for (const auto& p : held) out.push_back(p->header.client_seq);
  return out;
}

TEST(PushOrder, OnlyOrderedPushesCount) {
  EXPECT_TRUE(PushOrder::Ordered(*Push(7, 1)));
  EXPECT_TRUE(PushOrder::Ordered(*Push(7, 1, Op::kDensePush)));
  EXPECT_FALSE(PushOrder::Ordered(*Push(7, 1, Op::kSparsePull)));
  EXPECT_FALSE(PushOrder::Ordered(*Push(0, 1)));  // no client id
  auto forwarded = Push(7, 1);
  forwarded->header.replica_from = 2;  // its primary orders it
  EXPECT_FALSE(PushOrder::Ordered(*forwarded));
  auto retry = Push(7, 1, Op::kSparsePushPull);
  retry->admitted_as_retry = true;  // the pull left of a push-pull applied already
  EXPECT_FALSE(PushOrder::Ordered(*retry));
}

TEST(PushOrder, LaterPushesOfAParkedPushsClientAreHeldInSequenceOrder) {
  PushOrder order;
  auto parked = Push(7, 1);
  EXPECT_FALSE(order.Hold(parked));  // nothing parked yet: it goes through
  order.NoteParked(*parked);
  EXPECT_TRUE(parked->order_parked);
  // Another client, a pull and a forwarded push are not held.
  EXPECT_FALSE(order.Hold(Push(8, 2)));
  EXPECT_FALSE(order.Hold(Push(7, 9, Op::kSparsePull)));
  auto forwarded = Push(7, 5);
  forwarded->header.replica_from = 3;
  EXPECT_FALSE(order.Hold(forwarded));
  // Held in sequence order, whatever order they come in.
  EXPECT_TRUE(order.Hold(Push(7, 4)));
  EXPECT_TRUE(order.Hold(Push(7, 2)));
  EXPECT_TRUE(order.Hold(Push(7, 3)));
  EXPECT_EQ(order.held_now(), 3u);
  EXPECT_EQ(order.held_total(), 3u);
  EXPECT_TRUE(order.Release(7).empty());  // still parked: none leaves
  EXPECT_EQ(order.held_now(), 3u);
  EXPECT_TRUE(order.Unpark(*parked));  // the client's last parked push
  EXPECT_FALSE(parked->order_parked);
  EXPECT_EQ(Seqs(order.Release(7)), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(order.held_now(), 0u);
  EXPECT_EQ(order.held_total(), 3u);
  EXPECT_FALSE(order.Hold(Push(7, 5)));  // the client is forgotten: nothing is held now
}

TEST(PushOrder, HeldPushesWaitForEveryParkedPushOfTheClient) {
  PushOrder order;
  auto first = Push(7, 1), second = Push(7, 2);
  order.NoteParked(*first);
  order.NoteParked(*second);
  order.NoteParked(*second);  // counted once
  EXPECT_TRUE(order.Hold(Push(7, 3)));
  EXPECT_FALSE(order.Unpark(*first));  // the second is still parked
  EXPECT_FALSE(order.Unpark(*first));  // not parked any more: no change
  EXPECT_TRUE(order.Release(7).empty());
  EXPECT_TRUE(order.Unpark(*second));
  EXPECT_EQ(Seqs(order.Release(7)), (std::vector<uint64_t>{3}));
}

TEST(PushOrder, APullIsNeverCountedAsParked) {
  PushOrder order;
  auto pull = Push(7, 0, Op::kSparsePull);
  order.NoteParked(*pull);
  EXPECT_FALSE(pull->order_parked);
  EXPECT_FALSE(order.Unpark(*pull));
  EXPECT_FALSE(order.Hold(Push(7, 1)));
}

}  // namespace
}  // namespace tessera::internal
